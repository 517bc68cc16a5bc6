"""The authors' exact regime (experiment=miniature_authors_exact) is what docs/methods.md says it is."""

import re
from pathlib import Path

import yaml

from server_app.config import compose

PROJECT = Path(__file__).resolve().parents[1]
PRESET = PROJECT / "conf" / "experiment" / "miniature_authors_exact.yaml"


def documented() -> dict[str, object]:
    """`key=value` of the table's third column in docs/methods.md, "The authors' exact regime"."""
    text = (PROJECT / "docs" / "methods.md").read_text()
    section = text.split("## The authors' exact regime\n")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 10, "the table is missing"
    pairs = {}
    for row in rows[1:]:
        for key, value in re.findall(r"`([a-z_.]+)=([^`]+)`", row.split("|")[3]):
            pairs[key] = yaml.safe_load(value)
    return pairs


def lookup(cfg: dict, key: str):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def leaves(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        if isinstance(v, dict):
            out += leaves(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out


def test_the_exact_preset_resolves_to_the_documented_values():
    cfg = compose(["experiment=miniature_authors_exact"])
    table = documented()
    wrong = {k: (v, lookup(cfg, k)) for k, v in table.items() if lookup(cfg, k) != v}
    assert not wrong, f"docs/methods.md against the resolved preset (documented, resolved): {wrong}"


def test_every_key_the_exact_preset_sets_is_in_the_table():
    preset = yaml.safe_load(PRESET.read_text())
    preset.pop("defaults")
    missing = [k for k in leaves(preset) if k not in documented()]
    assert not missing, f"set in {PRESET.name} but not in docs/methods.md's table: {missing}"


def test_the_exact_regime_runs_no_warm_up_and_the_same_budget_for_every_row():
    """No warm-up to match, and no row changes the rounds: every row of claims_exact pairs."""
    from feddb.sweep import rows

    for row in ("fedavg", "fixmatch", "fixmatch-feddpl", "feddb-without-dpl", "feddb"):
        assert "num_rounds" not in rows()[row] and "warmup" not in rows()[row]
    cfg = compose(["experiment=miniature_authors_exact", "method=fedavg"])
    assert cfg["train"]["warmup_rounds"] == 0 and cfg["num_rounds"] == 200

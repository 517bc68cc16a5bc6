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


def exact_trainer(*extra):
    import torch

    from fssl.methods import make_model, make_trainer
    from fssl.runtime import data_meta, dataset_for

    cfg = compose(["experiment=miniature_authors_exact", "method=fixmatch", *extra])
    cfg["data_meta"] = meta = data_meta(dataset_for(cfg))
    trainer = make_trainer(cfg, meta["mean"], meta["std"], torch.device("cpu"))
    torch.manual_seed(0)
    return trainer, make_model(cfg, meta["num_classes"], meta["channels"]), cfg


def test_the_exact_preset_makes_the_authors_passes():
    """Separate passes (each view its own batch statistics) and pseudo-label/APP-U batches of 250
    in the pool's order: what the preset resolves to, and what those values do."""
    import torch

    cfg = compose(["experiment=miniature_authors_exact"])
    assert cfg["train"]["forward"] == "separate" and cfg["train"]["infer_batch_size"] == 250
    assert cfg["model"]["norm"] == "batchstat"
    trainer, model, _ = exact_trainer()
    g = torch.Generator().manual_seed(1)
    views = [torch.randn(n, 1, 28, 28, generator=g) + shift for n, shift in ((7, 0.0), (30, 2.0))]
    separate = trainer.forward_parts(model, views)
    one_by_one = torch.cat([trainer.forward(model, v) for v in views])
    assert torch.equal(separate, one_by_one)
    trainer.tr["forward"] = "joint"
    assert not torch.allclose(trainer.forward_parts(model, views), separate, atol=1e-3)
    # the no-grad pass: chunks of 250 in order, each normalised by its own statistics
    x = torch.randint(0, 256, (600, 1, 28, 28), generator=g, dtype=torch.uint8)
    chunks = torch.cat([trainer.predict(model, x[i : i + 250]) for i in (0, 250, 500)])
    assert torch.equal(trainer.predict(model, x), chunks)
    assert not torch.allclose(trainer.predict(model, x.flip(0)).flip(0), chunks)  # order matters


def test_separate_and_joint_passes_agree_where_the_batch_does_not_matter():
    import torch

    trainer, model, _ = exact_trainer("model.norm=gn")
    views = [torch.randn(n, 1, 28, 28) for n in (5, 9)]
    joint = trainer.forward_parts(model, views)
    trainer.tr["forward"] = "joint"
    assert torch.allclose(trainer.forward_parts(model, views), joint, atol=1e-5)

"""The one table of runs (feddb/rows.py, conf/comparison/*.yaml): every registered method is in
it with its display name, every tool reads it, and no other code lists methods with switches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from feddb.report import local_variant
from feddb.rows import DEFAULT_COMPARE, Row, comparisons, display_order, row_of, table
from feddb.sweep import rows as sweep_rows
from fssl.methods import discover
from server_app.config import compose
from studies import claims, ladder

PROJECT = Path(__file__).resolve().parents[1]
TOOLS = ("feddb", "studies", "benchmarks", "server_app", "client_app", "strategy", "fssl")


def test_every_registered_method_is_a_row_with_its_display_name():
    trainers = {
        yaml.safe_load(p.read_text())["method"]["trainer"]: p.stem
        for p in (PROJECT / "conf" / "method").glob("*.yaml")
        if p.stem != "custom"
    }
    order = display_order()
    for name in discover():
        assert name in trainers, f"no conf/method YAML trains with {name}"
        row = table()[trainers[name]]
        assert row.display in order, f"{name} is not in the reports' order"
    assert {"FedDB", "SoftMatch", "FlexMatch", "FreeMatch", "DebiasPL"} <= set(order)


@pytest.mark.parametrize(
    "name", ["fixmatch-feddpl", "feddb-without-dma", "fixmatch-feddpl-global", "fixmatch-online"]
)
def test_a_rows_display_name_is_what_the_report_calls_its_runs(name):
    row = table()[name]
    cfg = compose(
        [f"method={row.method}"]
        + ([f"dpl={str(row.dpl).lower()}"] if row.dpl is not None else [])
        + ([f"dma.enabled={str(row.dma).lower()}"] if row.dma is not None else [])
        + ([f"dpl_prior={row.prior}"] if row.prior else [])
        + row.overrides.split()
    )
    assert local_variant(cfg) == row.display
    assert table()["fixmatch-online"].display == "FixMatch (online)"  # not FixMatch's row


def test_sweeps_claims_and_the_ladder_read_the_table():
    assert sweep_rows()["fixmatch-feddpl-global"] == table()["fixmatch-feddpl-global"].run_config()
    assert table()["fixmatch-feddpl-global"].run_config() == (
        "method='fixmatch' dpl=true overrides='dpl_prior=global'"
    )
    assert set(claims.ROWS) | set(ladder.ROWS) <= set(table())
    assert list(ladder.methods().values())[2] == "method='fixmatch' dpl=true"
    labels = claims.labels()
    for pairs in claims.CLAIMS.values():  # every claim compares rows the study runs
        for a, b in pairs:
            for lab in (a, b):
                lab = lab.replace(claims.NATIVE, claims.UNIFORM).replace(claims.OTHER, claims.SIZES)
                assert lab in labels, lab


def test_a_row_with_an_unknown_key_is_refused_naming_it():
    with pytest.raises(ValueError, match="row 'x': keys \\['dlp'\\]"):
        row_of("x", {"method": "fixmatch", "dlp": True})
    assert Row("y", "fixmatch", dpl=True, strategy="krum").run_config() == (
        "method='fixmatch' dpl=true strategy='krum'"
    )


def test_a_row_compared_with_a_row_not_in_the_table_is_refused(monkeypatch, tmp_path):
    from feddb import rows

    (tmp_path / "t.yaml").write_text("s:\n  a: {method: fixmatch, compare: [fixmach]}\n")
    monkeypatch.setattr(rows, "TABLE", tmp_path)
    table.cache_clear()
    try:
        with pytest.raises(ValueError, match="row 'a': compare names \\['fixmach'\\]"):
            table()
    finally:
        table.cache_clear()


@pytest.mark.parametrize("page", ["docs/miniature/results.md", "docs/methods_study/results.md"])
def test_published_reports_keep_their_comparisons(page):
    """The table's comparisons are the Holm families of the reports already published: the
    comparisons among a page's variants are exactly the page's."""
    text = (PROJECT / page).read_text()
    published = set(re.findall(r"^\| [^|]+ \| ([^|]+?) − ([^|]+?) \|", text, re.M))
    shown = {v for pair in published for v in pair}
    assert len(published) > 5
    assert set(comparisons(shown)) == published


def test_a_method_the_table_does_not_list_gets_the_default_references():
    derived = comparisons(["FedAvg", "FixMatch", "FixMatch (online)", "Mine", "FlexMatch-FedDPL"])
    assert [b for a, b in derived if a == "Mine"] == [table()[r].display for r in DEFAULT_COMPARE]
    assert [b for a, b in derived if a == "FlexMatch-FedDPL"] == []  # FlexMatch itself is absent
    assert ("FlexMatch-FedDPL", "FlexMatch") in comparisons(["FlexMatch-FedDPL", "FlexMatch"])


def test_no_other_code_lists_methods_with_their_switches():
    """A run-config naming a method and DPL or DMA outside the table is a second table."""
    pattern = re.compile(r"method='[\w-]+'[^\"\n]*\b(dpl|dma)=(true|false)")
    found = [
        f"{p.relative_to(PROJECT)}"
        for top in TOOLS
        for p in (PROJECT / top).rglob("*.py")
        if pattern.search(p.read_text())
    ]
    assert found == []


def test_an_online_labeller_is_paired_with_fixmatch_labelling_online():
    from feddb.report import paired

    runs = [
        {
            "setting": "δ=0.3",
            "variant": v,
            "seed": s,
            "final": acc + s / 100,
            "collapsed": False,
            "cfg": {"seed": s, "train": {"warmup_rounds": 0}},  # what the pairing rule reads
            "rounds": [],
        }
        for v, acc in (("FixMatch", 0.90), ("FixMatch (online)", 0.91), ("SoftMatch", 0.93))
        for s in range(3)
    ]
    pairs = {(p["a"], p["b"]) for p in paired(runs)}
    assert {("SoftMatch", "FixMatch (online)"), ("SoftMatch", "FixMatch")} <= pairs
    assert ("FixMatch (online)", "FixMatch") in pairs


@pytest.mark.parametrize("page", ["README.md", "docs/methods.md", "docs/configuration.md"])
def test_the_docs_name_every_registered_method(page):
    """The pages that list the methods keep up with the registry: a new method is named there."""
    text = (PROJECT / page).read_text()
    trainers = {
        yaml.safe_load(p.read_text())["method"]["trainer"]: p.stem
        for p in (PROJECT / "conf" / "method").glob("*.yaml")
        if p.stem != "custom"
    }
    missing = [  # by its display name or, in a list of values, its configuration name
        table()[trainers[name]].display
        for name in discover()
        if table()[trainers[name]].display not in text and f"`{trainers[name]}`" not in text
    ]
    assert missing == [], f"{page} does not name {missing}"


def test_feddb_is_fixmatch_with_dpl_and_dma_and_nothing_of_its_own():
    from fssl.methods.feddb import FedDB
    from fssl.methods.fixmatch import FixMatch

    assert FedDB.__bases__ == (FixMatch,)
    own = {k for k, v in vars(FedDB).items() if callable(v) and not k.startswith("__")}
    assert own == set()  # every step is FixMatch's
    m = yaml.safe_load((PROJECT / "conf" / "method" / "feddb.yaml").read_text())["method"]
    assert m["trainer"] == "feddb" and {p for p in ("dpl", "dma") if m[p]} == set(FedDB.parts)

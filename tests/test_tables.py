"""`feddb tables`: the docs' measured tables are the measurement files' figures, rendered by the
commands that measured them, and none is typed by hand."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from benchmarks.throughput import docs_table
from feddb import tables

ROOT = Path(__file__).resolve().parents[1]
CPU_BENCH = ROOT / "docs/measurements/bench_cpu_small.json"
BENCH = "benchmarks.speed:table"


def test_the_docs_tables_match_their_files():
    assert tables.main(["--check"]) == 0


@pytest.mark.parametrize(("page", "measured"), [("docs/speed.md", "|"), ("README.md", ".")])
def test_every_measured_table_of_the_page_is_generated(page, measured):
    """A table row of speed.md, or a README row holding a decimal figure, lies between the markers:
    no measured figure is typed (the README's command table is reference, not measurement)."""
    lines = (ROOT / page).read_text().split("\n")
    inside = False
    for n, line in enumerate(lines, 1):
        if tables.BEGIN.match(line):
            inside = True
        elif line == tables.END:
            inside = False
        elif line.startswith("|") and (measured == "|" or re.search(r"\d\.\d", line)):
            assert inside, f"{page}:{n} is a table row outside the generated tables"


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def claim_row(regime, setting, claim, a, b, mean, verdict, counts=("0", "0", "0")) -> dict:
    return {
        "regime": regime, "setting": setting, "claim": claim, "a": a, "b": b,
        "seeds": "0 1 2 3 4", "primary": "1", "final_mean": mean, "final_low": "-1.0",
        "final_high": "2.5", "verdict": verdict, "decided_on_counts": counts[0],
        "collapsed_a": counts[1], "collapsed_b": counts[2],
    }  # fmt: skip


def test_the_readme_table_is_rendered_from_claims_csv(tmp_path):
    """The README's main result comes from `feddb claims`' CSVs: bold where Holm decides, the
    collapse counts where they decide, a dash for a cell without runs, the runs' provenance."""
    (tmp_path / "docs/claims").mkdir(parents=True)
    write_csv(tmp_path / "docs/claims/claims.csv", [
        claim_row("cpu", "δ=0.1", "SSL helps", "FixMatch, n_m", "FedAvg", "0.7500", "holds"),
        claim_row("cpu", "δ=0.3", "SSL helps", "FixMatch, n_m", "FedAvg", "-0.2000", "not shown"),
        claim_row("cpu", "δ=0.1", "FedDB beats FixMatch", "FedDB", "FixMatch, n_m", "50.0",
                  "holds", counts=("1", "0", "5")),
        {**claim_row("cpu", "IID", "SSL helps", "FixMatch, n_m", "FedAvg", "9.0", "holds"),
         "primary": "0"},
    ])  # fmt: skip
    runs = [
        {"regime": "cpu", "partition": p, "seed": s, "commit": c, "hardware": "Xeon, 2 cores",
         "date": d}
        for p, s, c, d in [("dir0.1", 0, "bbbbbbb1", "2026-11-02T10:00:00"),
                           ("dir0.3", 1, "aaaaaaa1", "2026-11-01T09:00:00"),
                           ("iid", 2, "ccccccc1", "2026-11-03T09:00:00")]
    ]  # fmt: skip
    write_csv(tmp_path / "docs/claims/runs.csv", runs)
    marker = "<!-- feddb tables: studies.claims:readme_table docs/claims/claims.csv docs/claims/runs.csv -->"
    (tmp_path / "README.md").write_text(f"# R\n\n{marker}\n{tables.END}\n")
    assert tables.main(["--root", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert "| claim (points, 95 % interval) | CPU, δ = 0.1 | CPU, δ = 0.3 |\n" in text
    assert "| SSL: FixMatch − FedAvg | **+0.75** [−1.00, +2.50] | −0.20 [−1.00, +2.50] |" in text
    assert "| FedDB − FixMatch | **collapsed 0 of 5 vs 5 of 5** | – |" in text
    assert "+9.00" not in text  # a secondary comparison or another setting is not the README's
    assert (
        "2 runs, Xeon, 2 cores, 2026-11-01 to 2026-11-02, commits aaaaaaa to bbbbbbb, seeds 0, 1."
        in text
    )


def page_with_bench(tmp_path: Path, data: dict, table: str = "| stale |") -> Path:
    docs = tmp_path / "docs"
    (docs / "measurements").mkdir(parents=True)
    (docs / "measurements/bench.json").write_text(json.dumps(data))
    page = docs / "speed.md"
    page.write_text(
        f"# Speed\n\n<!-- feddb tables: {BENCH} measurements/bench.json -->\n{table}\n"
        f"{tables.END}\n\nprose after\n"
    )
    return page


def test_a_changed_file_changes_its_table(tmp_path):
    data = json.loads(CPU_BENCH.read_text())
    data["round_seconds"] = {"project": 2.0, "reference": 9.0}
    page = page_with_bench(tmp_path, data)
    assert tables.main(["--check", "--root", str(tmp_path)]) == 1
    assert page.read_text().count("| stale |") == 1  # --check changes nothing
    assert tables.main(["--root", str(tmp_path)]) == 0
    text = page.read_text()
    assert "| 2.00 | 9.00 | **4.5×** |" in text and "| stale |" not in text
    assert text.endswith(f"{tables.END}\n\nprose after\n")
    assert tables.main(["--check", "--root", str(tmp_path)]) == 0


def test_throughput_beside_its_mps_measurement():
    files = [
        json.loads((ROOT / f"docs/measurements/throughput_h200_paper{s}.json").read_text())
        for s in ("", "_mps")
    ]
    rows = docs_table(*files).split("\n")
    assert rows[0].endswith("| 40 runs of 800 rounds |")
    assert re.fullmatch(r"\| 8 \| 1\.59 \| 0\.63 \| 3\.16 \| 0\.32 \| 2\.8 h \(MPS\) \|", rows[-1])
    assert rows[2] == "| 1 | 0.66 | 1.52 |  |  | 13.5 h |"


def test_bad_markers_are_one_line_and_exit_2(tmp_path, capsys):
    page = page_with_bench(tmp_path, {})
    page.write_text(page.read_text().replace(BENCH, "benchmarks.speed:tabel"))
    assert tables.main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no function benchmarks.speed:tabel" in err and "\n" not in err
    page.write_text(page.read_text().replace("tabel measurements/bench.json", "table nope.json"))
    assert tables.main(["--root", str(tmp_path)]) == 2
    assert "no measurement file" in capsys.readouterr().err
    assert tables.main(["--root", str(tmp_path / "nowhere")]) == 2
    assert "no docs/ in" in capsys.readouterr().err
    page.write_text(f"<!-- feddb tables: {BENCH} x.json -->\n| a |\n")
    assert tables.main(["--root", str(tmp_path)]) == 2
    assert "no '<!-- end of generated table -->'" in capsys.readouterr().err
    # a table without its end marker never swallows the next table
    bench = page.parent / "measurements/bench.json"
    first = f"<!-- feddb tables: {BENCH} measurements/bench.json -->"
    page.write_text(f"{first}\n| a |\n\n{first}\n| b |\n{tables.END}\n")
    assert tables.main(["--root", str(tmp_path)]) == 2
    assert "no '<!-- end of generated table -->'" in capsys.readouterr().err
    assert page.read_text().count(first) == 2
    page.write_text(f"{first}\n{tables.END}\n")
    bench.write_text("{not json")
    assert tables.main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot render it" in err and "Traceback" not in err


def ladder_records() -> list[dict]:
    from studies.ladder import methods

    names = list(methods())
    prov = {"hardware": "Intel(R) Xeon(R) Processor, 2 cores", "date": "2026-11-28T14:00:00"}
    out = [
        {"rung": "central, minibatch", "labels": n, "method": m, "final_test_accuracy": acc}
        for n, acc in ((100, 0.93), (40, 0.85))
        for m in names[:2]
    ]
    out += [
        {
            "rung": "federated, dir0.1",
            "labels": 100,
            "method": m,
            "final_test_accuracy": 0.8 + i / 100,
        }
        for i, m in enumerate(names)
    ]
    out += [
        {
            "rung": "protocol, dir0.3",
            "labels": 100,
            "method": "FixMatch, no warm-up",
            "final_test_accuracy": 0.9255,
            "pseudo_label_accuracy": None,
        }
    ]
    return [{**prov, "commit": "abcdef0123", "seed": 0, "collapsed": False, **r} for r in out]


def test_the_ladders_tables_pivot_its_records():
    from studies.ladder import docs_table, methods, protocol_table

    records = ladder_records()
    table = docs_table(records).split("\n")
    assert table[0] == "| rung | " + " | ".join(methods()) + " |"
    assert table[2] == "| central, minibatch, 100 labels | 93.00 | 93.00 |  |  |"
    assert table[4] == "| federated, dir0.1 | 80.00 | 81.00 | 82.00 | 83.00 |"
    assert table[-1] == (
        "*Intel(R) Xeon(R) Processor, 2 cores; 2026-11-28; commit abcdef0; seed 0; 0 of 8 runs "
        "collapsed.*"
    )
    proto = protocol_table(records).split("\n")
    assert proto[2] == "| no warm-up | 92.55 | – |" and "0 of 1 runs" in proto[-1]


def test_a_rungs_record_keeps_its_provenance(tmp_path):
    from studies.ladder import record

    (tmp_path / "provenance.json").write_text(
        json.dumps({"hardware": "h", "date": "d", "commit": "c", "torch": "t"})
    )
    run = {"rung": "federated, iid", "labels": 100, "method": "FedAvg", "run_dir": tmp_path}
    summary = {"final_test_accuracy": 0.9, "selected_test_accuracy": 0.89, "collapsed": False}
    rec = record({**run, "summary": summary, "pl_accuracy": None}, seed=3)
    assert rec["seed"] == 3 and rec["final_test_accuracy"] == 0.9
    assert (rec["hardware"], rec["date"], rec["commit"]) == ("h", "d", "c") and "torch" not in rec

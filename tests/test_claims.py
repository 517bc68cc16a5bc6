"""`feddb claims`: the paper's claims as paired comparisons over the claims study's runs."""

import csv
import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml

from feddb.report import CAPTIONS, embed
from feddb.stats import holm
from fssl import identity
from server_app.config import compose
from studies import claims, factors

ROWS = {
    "fedavg": ["method=fedavg"],
    "fixmatch": ["method=fixmatch"],
    "fixmatch-uniform": ["method=fixmatch", "server.weighting=uniform"],
    "fixmatch-feddpl": ["method=fixmatch", "dpl=true"],
    "fixmatch-feddpl-global": ["method=fixmatch", "dpl=true", "dpl_prior=global"],
    "feddb-without-dpl": ["method=feddb", "dpl=false"],
    "feddb": ["method=feddb"],
}


def fake_run(
    root,
    row,
    seed,
    final,
    worst,
    top,
    rounds=6,
    warmup=2,
    complete=True,
    warm_acc=None,
    device="cpu",
    regime="cpu",
    collapsed=False,
    hardware="CPU, 2 cores",
    experiment="miniature",
    extra=(),
    selection=None,
):
    """A run's records: its warm-up rounds at a seed's common accuracy (`warm_acc` gives it
    another warm-up), the rest at `final`; its identity names its row (and `selection`)."""
    cfg = compose(
        [
            *ROWS.get(row, ["method=fixmatch"]),
            f"experiment={experiment}",
            *extra,
            f"seed={seed}",
            f"num_rounds={rounds}",
            f"train.warmup_rounds={warmup}",
            "partition=dir0.1",
        ]
    )
    d = root / regime / "mnist10k_dir0.1" / row / f"s{seed}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    ident = {
        "row": row.partition("@")[0],
        "row_from": "table",
        "selection": selection,
        "regime": experiment,
        "config": identity.config_fingerprint(cfg),
        "dataset": "mnist10k",
        "partition": "dir0.1",
    }
    (d / "identity.json").write_text(json.dumps(ident))
    (d / "provenance.json").write_text(
        json.dumps(
            {
                "commit": "abcdef0123",
                "dirty": False,
                "date": "2026-11-25T10:00:00+00:00",
                "hardware": hardware,
                "device": device,
            }
        )
    )
    lines = []
    for r in range(1, (rounds if complete else rounds - 1) + 1):
        acc = final if r > warmup else 0.5 + seed / 100 if warm_acc is None else warm_acc
        cls = [worst if r > warmup else acc] + [acc] * 9
        lines.append(
            {
                "round": r,
                "test_accuracy": acc,
                "val_accuracy": acc,
                "class_accuracy": cls,
                "top_class_share": top if r > warmup else 0.13,
                "collapsed": collapsed and r == rounds,
                "clients": [{"app_u": [0.2, 0.8], "app_u_global": [0.3, 0.7]}],
                "robust": {"rule": "mean", "clip": None},
                "dma": None,
            }
        )
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def test_claims_are_decided_by_paired_intervals_over_seeds(tmp_path):
    noise = [0.0, 0.004, -0.003]
    for seed, e in enumerate(noise):
        # differences that vary over the seeds: identical ones have no t-test (p is NaN)
        fake_run(tmp_path, "fedavg", seed, 0.80 + e / 2, 0.5, 0.14)
        fake_run(tmp_path, "fixmatch", seed, 0.90 + e, 0.7, 0.12)  # SSL: +10
        fake_run(tmp_path, "fixmatch-uniform", seed, 0.90 + e, 0.7, 0.12)
        fake_run(tmp_path, "fixmatch-feddpl", seed, 0.88 + e / 2, 0.75, 0.11)  # DPL -2, worst +5
        fake_run(tmp_path, "feddb-without-dpl", seed, 0.90 + (-e if seed else 0.01), 0.7, 0.12)
        fake_run(tmp_path, "feddb", seed, 0.88 + e / 2, 0.75, 0.11)
    fake_run(tmp_path, "feddb", 3, 0.99, 0.9, 0.1, complete=False)  # still running
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    md = (out / "claims.md").read_text()
    section = md[md.index("## Verdicts") : md.index("## cpu regime")]
    verdicts = {
        line.split("|")[1].strip(): line.split("|")[2].split("(")[0].strip()
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| claim")
    }
    assert verdicts == {
        "SSL helps": "holds",
        "DPL helps": "fails",
        "DMA helps": "not shown",
        "FedDB beats FixMatch": "fails",
        "The global prior helps": "–",
    }
    assert "Provenance: 18 complete runs, started at commit abcdef0;" in md  # unfinished: out
    assert "18 runs on CPU, 2 cores, one CPU thread each;" in md
    assert "Defences that changed an aggregate: 0 of 18 runs" in md
    rows = list(csv.DictReader((out / "claims.csv").open()))
    dpl = next(r for r in rows if r["a"] == "FixMatch-FedDPL, n_m")
    assert dpl["b"] == "FixMatch, n_m" and dpl["seeds"] == "0 1 2"
    assert float(dpl["final_mean"]) == pytest.approx(-2.0 - 100 * np.mean(noise) / 2, abs=1e-4)
    assert float(dpl["worst_final_mean"]) == pytest.approx(5.0)  # the worst class gains
    assert float(dpl["top_final_mean"]) == pytest.approx(1.0)  # share falls 1 point
    assert "| FixMatch, n_m | 3 | 90.03 ± 0.35 |" in md
    assert "| 0.200 | 0 |" in md  # APP-U moved (L1)
    for png in ("cpu_classes.png", "cpu_pseudo_labels.png", "cpu_figure3.png"):
        assert (out / png).stat().st_size > 10_000 and f"]({png})" in md
    # the archived records give the same tables
    import tarfile

    assert (
        claims.main([str(tmp_path), "--out", str(out), "--archive", str(tmp_path / "a.tar.xz")])
        == 0
    )
    with tarfile.open(tmp_path / "a.tar.xz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    again = tmp_path / "again"
    assert claims.main([str(tmp_path / "unpacked" / tmp_path.name), "--out", str(again)]) == 0
    assert (again / "claims.csv").read_text() == (out / "claims.csv").read_text()


def test_a_regime_of_one_seed_is_tabled_but_decides_nothing(tmp_path):
    """A reproduction record (one seed re-run on another machine) gets its section and its runs
    in runs.csv, but no column of verdicts: one paired difference is no test."""
    for seed in (0, 1):
        fake_run(tmp_path, "fedavg", seed, 0.80 + seed / 100, 0.5, 0.14)
        fake_run(tmp_path, "fixmatch", seed, 0.90, 0.7, 0.12)
    fake_run(tmp_path, "fedavg", 0, 0.80, 0.5, 0.14, regime="record")
    fake_run(tmp_path, "fixmatch", 0, 0.90, 0.7, 0.12, regime="record")
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    md = (out / "claims.md").read_text()
    verdicts = md[md.index("## Verdicts") : md.index("## cpu regime")]
    assert "| claim | cpu, δ=0.1 |" in verdicts and "record" not in verdicts
    assert "## record regime, δ=0.1" in md
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert sorted(r["regime"] for r in runs) == ["cpu"] * 4 + ["record"] * 2


def test_runs_are_named_by_what_they_ran():
    name = lambda *o: claims.label(compose(["experiment=miniature", *o]))  # noqa: E731
    assert name("method=fixmatch") == "FixMatch, n_m"
    assert name("method=fixmatch", "server.weighting=uniform") == "FixMatch, uniform"
    assert name("method=fixmatch", "experiment=miniature_authors") == "FixMatch, uniform"
    assert name("method=feddb", "dpl=false") == "FedDB w/o DPL"
    assert name("method=feddb", "dma.enabled=false") == "FixMatch-FedDPL, n_m"
    assert claims.setting_of(compose(["partition=lt100"])) == "long-tailed pool, ratio 100"


def test_claims_input_errors(tmp_path, capsys):
    assert claims.main([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert claims.main([str(tmp_path)]) == 2
    assert "no complete runs" in capsys.readouterr().err


def test_reproduce_reruns_a_published_run_and_checks_the_tolerance(
    small_npz, tmp_path, capsys, task_identity
):
    """A run in the sweep layout, its runs.csv line, then `feddb reproduce`: the same code and
    run-config land on the same accuracy; a published figure moved by 2 points does not pass; a
    run published from another machine is said to be."""
    from localgrid import run_in_process

    from feddb import runlist
    from feddb.report import load_runs
    from studies import reproduce

    run_dir = tmp_path / "pub" / "cpu" / "npz_dir0.3" / "fixmatch" / "s1"
    run_in_process(
        {
            "method": "fixmatch",
            "dataset": "npz",
            "data-path": str(small_npz),
            "seed": 1,
            "num-server-rounds": 2,
            "output-dir": str(run_dir),
            "overrides": "fl.num_clients=4 fl.fraction_train=0.5 dataset.num_labeled=100 "
            "train.tau=0.5 fl.node_wait=0 checkpoint.every=0",
        }
    )
    runs = [dict(r, regime="cpu") for r in load_runs([tmp_path / "pub"])]
    table = tmp_path / "runs.csv"
    runlist.write_runs(runs, table)
    line = next(csv.DictReader(table.open()))
    assert (line["regime"], line["row"], line["dataset"], line["partition"], line["seed"]) == (
        "cpu",
        "fixmatch",
        "npz",
        "dir0.3",
        "1",
    )
    assert "output-dir" not in json.loads(line["run_config"])
    here = json.loads((run_dir / "provenance.json").read_text())["hardware"]
    assert line["hardware"] == here and "cores" in here
    out = tmp_path / "again"
    assert reproduce.main([str(table), "--select", "regime=cpu seed=1", "--out", str(out)]) == 0
    assert "1 of 1 within 1.5 points (largest difference 0.00)" in capsys.readouterr().out
    moved = tmp_path / "moved.csv"
    moved.write_text(
        table.read_text().replace(f",{line['final']},", f",{float(line['final']) + 2:.2f},")
    )
    assert reproduce.main([str(moved), "--select", "seed=1", "--out", str(out)]) == 1  # reused
    printed = capsys.readouterr().out
    assert "OUTSIDE the tolerance" in printed and "another machine" not in printed
    assert f"({line['commit'][:7]}, {here})" in printed
    other = tmp_path / "other.csv"
    other.write_text(table.read_text().replace(here, "AMD EPYC 7B13, 2 cores"))
    assert reproduce.main([str(other), "--select", "seed=1", "--out", str(out)]) == 0
    assert f"on {here}, another machine ok" in capsys.readouterr().out
    old = tmp_path / "old.csv"  # written before the hardware column: nothing said
    old.write_text(table.read_text().replace(here, ""))
    assert reproduce.main([str(old), "--select", "seed=1", "--out", str(out)]) == 0
    assert "another machine" not in capsys.readouterr().out
    assert reproduce.main([str(table), "--select", "seed=7", "--out", str(out)]) == 2
    assert reproduce.main([str(table), "--select", "colour=red"]) == 2
    assert "choose from regime" in capsys.readouterr().err


def test_provenance_records_the_device_that_auto_chose():
    import torch

    from fssl.provenance import provenance

    assert provenance("auto")["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert provenance("cpu")["device"] == "cpu"


def test_reproduce_tells_the_same_row_and_seed_apart_by_scenario(tmp_path):
    """The scenarios' runs.csv holds fixmatch seed 0 three times, once per scenario: each line
    says its scenario, --select picks one, and each re-run gets its own folder (they shared one,
    so the second re-run reused the first's result)."""
    from feddb import runlist
    from studies import reproduce

    runs = []
    for scenario in ("labels_at_clients", "labels_at_server", "labels_at_partial_clients"):
        d = tmp_path / scenario / "mnist10k_dir0.3" / "fixmatch" / "s0"
        d.mkdir(parents=True)
        (d / "run_config.json").write_text(json.dumps({"scenario": scenario}))
        cfg = {"scenario": {"name": scenario}}
        ident = {"row": "fixmatch", "dataset": "mnist10k", "partition": "dir0.3"}
        runs.append(
            {"dir": d, "cfg": cfg, "identity": ident, "seed": 0, "final": 0.9, "selected": None}
        )
    table = tmp_path / "runs.csv"
    runlist.write_runs(runs, table)
    lines = list(csv.DictReader(table.open()))
    chosen = reproduce.select(lines, "scenario=labels_at_server seed=0", [])
    assert [x["scenario"] for x in chosen] == ["labels_at_server"]
    dirs = {reproduce.rerun_dir(x, tmp_path / "again") for x in lines}
    assert len(dirs) == 3
    assert tmp_path / "again" / "-" / "mnist10k_dir0.3" / "fixmatch" / "s0" in dirs  # as before
    old = [{k: v for k, v in x.items() if k != "scenario"} for x in lines[:1]]  # an older file
    assert reproduce.select(old, "scenario=labels_at_clients", []) == old


def test_claims_print_paired_p_values_holm_corrected_and_seed_signs(tmp_path):
    """Hand-made runs whose p-values are known in closed form: with 3 seeds (2 degrees of freedom)
    the two-sided t-test gives p = 1 - |t| / sqrt(t^2 + 2). FixMatch - FedAvg = +1, +2, +3 points:
    t = 2 sqrt(3), p = 0.07418; FedDB - FixMatch = -1, -1.5, -2: t = -3 sqrt(3), p = 0.03775.
    Holm over the regime's primary comparisons (here these and two with no difference, p = 1)
    multiplies the smallest by 4 and the next by 3."""
    t1, t2 = 2 * np.sqrt(3), 3 * np.sqrt(3)
    p_ssl, p_feddb = 1 - t1 / np.sqrt(t1**2 + 2), 1 - t2 / np.sqrt(t2**2 + 2)
    for seed in range(3):
        fake_run(tmp_path, "fedavg", seed, 0.80, 0.5, 0.14)
        fake_run(tmp_path, "fixmatch", seed, 0.80 + (seed + 1) / 100, 0.5, 0.14)
        fake_run(tmp_path, "fixmatch-feddpl", seed, 0.80 + (seed + 1) / 100, 0.5, 0.14)
        fake_run(tmp_path, "feddb-without-dpl", seed, 0.80 + (seed + 1) / 100, 0.5, 0.14)
        fake_run(tmp_path, "feddb", seed, 0.80 + (seed + 1) / 100 - (1 + seed / 2) / 100, 0.5, 0.14)
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    rows = {(r["a"], r["b"]): r for r in csv.DictReader((out / "claims.csv").open())}
    ssl, beats = rows[("FixMatch, n_m", "FedAvg")], rows[("FedDB", "FixMatch, n_m")]
    assert float(ssl["p"]) == pytest.approx(p_ssl, rel=1e-4)
    assert float(beats["p"]) == pytest.approx(p_feddb, rel=1e-4)
    assert float(beats["p_holm"]) == pytest.approx(4 * p_feddb, rel=1e-4)
    assert float(ssl["p_holm"]) == pytest.approx(max(3 * p_ssl, 4 * p_feddb), rel=1e-4)
    assert (ssl["seeds_above"], ssl["seeds_below"]) == ("3", "0")
    assert (beats["seeds_above"], beats["seeds_below"]) == ("0", "3")
    # symmetric: uncorrected, FedDB - FixMatch would "fail" at 0.05; corrected it is not shown
    assert beats["verdict"] == "not shown" and ssl["verdict"] == "not shown"
    secondary = rows[("FedDB", "FedAvg")]
    assert secondary["primary"] == "0" and secondary["p_holm"] == "" and secondary["verdict"] == ""
    md = (out / "claims.md").read_text()
    assert "| 0.074 | 0.223 | 3+ 0− (0.250) | 0; 0 (1.000) |" in md  # sign test: 2 / 2^3
    assert float(ssl["p_sign"]) == pytest.approx(0.25) and ssl["decided_on_counts"] == "0"


def test_a_reports_paired_table_gives_each_comparison_its_p_and_holms_over_the_table():
    """`feddb report`'s paired table is one family: the same closed-form p-values as above
    (3 seeds: p = 1 - |t| / sqrt(t^2 + 2)), and Holm over the table's three rows multiplies the
    smallest by 3 and the next by 2 (never below the one before it)."""
    from feddb.report import paired_table

    t1, t2 = 2 * np.sqrt(3), 3 * np.sqrt(3)
    p_ssl, p_feddb = 1 - t1 / np.sqrt(t1**2 + 2), 1 - t2 / np.sqrt(t2**2 + 2)

    def row(a, diffs):
        m = float(np.mean(diffs))
        return {
            "setting": "s",
            "a": a,
            "b": "FedAvg",
            "seeds": 3,
            "diffs": diffs,
            "mean": m,
            "low": m - 1,
            "high": m + 1,
        }

    rows = [
        row("FixMatch", [1.0, 2.0, 3.0]),
        row("FedDB", [-1.0, -1.5, -2.0]),
        row("SemiFL", [0.0, 0.0, 0.0]),
    ]
    lines = paired_table(rows, "the interval is")
    cells = {line.split(" | ")[1]: line.split(" | ")[6:8] for line in lines[2:]}
    assert cells["FixMatch − FedAvg"] == [f"{p_ssl:.3f}", f"{max(2 * p_ssl, 3 * p_feddb):.3f}"]
    assert cells["FedDB − FedAvg"] == [f"{p_feddb:.3f}", f"{3 * p_feddb:.3f}"]
    assert cells["SemiFL − FedAvg"] == ["1.000", "1.000"]


def test_a_pair_run_on_two_kinds_of_device_is_unmatched(tmp_path):
    """FixMatch on a GPU (bf16 by default there) against FedDB w/o DPL on the CPU: unmatched."""
    for seed in range(3):
        fake_run(tmp_path, "fixmatch", seed, 0.85, 0.5, 0.14, device="cuda:0")
        fake_run(tmp_path, "feddb-without-dpl", seed, 0.90, 0.5, 0.14)
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    rows = {(r["a"], r["b"]): r for r in csv.DictReader((out / "claims.csv").open())}
    assert rows[("FedDB w/o DPL", "FixMatch, n_m")]["verdict"] == "unmatched"


def test_a_comparison_whose_warm_ups_differ_is_unmatched_and_has_no_verdict(tmp_path):
    """FixMatch with another warm-up (the old fixmatch-uniform: uniform weights in the warm-up
    as well) against FedDB w/o DPL, whose warm-up is the regime's: the difference is reported as
    unmatched and gives no verdict, whatever its size."""
    for seed in range(3):
        fake_run(tmp_path, "fedavg", seed, 0.80, 0.5, 0.14)
        fake_run(tmp_path, "fixmatch", seed, 0.85 + seed / 1000, 0.5, 0.14, warm_acc=0.4)
        fake_run(tmp_path, "feddb-without-dpl", seed, 0.90, 0.5, 0.14)
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    rows = {(r["a"], r["b"]): r for r in csv.DictReader((out / "claims.csv").open())}
    dma = rows[("FedDB w/o DPL", "FixMatch, n_m")]
    assert dma["matched"] == "0" and dma["verdict"] == "unmatched" and dma["p_holm"] == ""
    md = (out / "claims.md").read_text()
    assert "| DMA helps | unmatched (+4.90 [" in md
    left_out = next(line for line in md.splitlines() if line.startswith("Left out, their warm-"))
    assert "FedDB w/o DPL − FixMatch, n_m" in left_out
    assert "| DMA helps | FedDB w/o DPL − FixMatch, n_m |" not in md  # not in the tables


def test_every_claims_row_of_a_seed_ends_the_warm_up_with_the_same_model(
    small_npz, tmp_path, task_identity
):
    """The rows a claim compares share their warm-up bit for bit, run to the end of a 2-round
    warm-up on one seed in the CPU regime (n_m warm-up): FedAvg, FedDB and fixmatch-uniform, which
    before server.warmup_weighting averaged its warm-up uniformly and so started its
    semi-supervised rounds from another model than the rows it was compared with."""
    from localgrid import run_in_process

    from feddb.sweep import rows
    from fssl import checkpoint

    table = rows()
    for regime in ("miniature",):
        models = {}
        for row in ("fedavg", "fixmatch-uniform", "feddb"):
            run_dir = tmp_path / regime / row
            rc = dict(
                item.split("=", 1) for item in shlex.split(table[row], posix=True)
            )  # e.g. method=fixmatch overrides=server.weighting=uniform
            run_in_process(
                {
                    "method": rc["method"],
                    "dpl": rc.get("dpl", "") == "true",
                    "experiment": regime,
                    "dataset": "npz",
                    "data-path": str(small_npz),
                    "seed": 3,
                    "num-server-rounds": 2,
                    "output-dir": str(run_dir),
                    "overrides": f"{rc.get('overrides', '')} fl.num_clients=4 "
                    "fl.fraction_train=0.75 dataset.num_labeled=100 dataset.val_size=100 "
                    "train.warmup_rounds=2 fl.node_wait=0 checkpoint.every=0 "
                    "logging.tensorboard=false",
                }
            )
            arrays, _ = checkpoint.load(run_dir)
            models[row] = arrays["global"]
        ref = models.pop("fedavg")
        for row, model in models.items():
            assert model.keys() == ref.keys()
            assert all(np.array_equal(model[k], ref[k]) for k in ref), (regime, row)


def test_the_published_claims_tables_hold_no_comparison_with_unmatched_warm_ups():
    """docs/claims: every verdict comes from a matched comparison, and the tables show only
    matched ones (the unmatched ones are named below them, out of the verdicts)."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs" / "claims"
    rows = list(csv.DictReader((docs / "claims.csv").open()))
    assert rows and all(r["matched"] == "1" for r in rows if r["primary"] == "1")
    assert all(r["verdict"] == "" for r in rows if r["matched"] == "0")
    md = (docs / "claims.md").read_text()
    for r in rows:
        cell = md.split(f"## {r['regime']} regime, {r['setting']}\n")[1].split("\n## ")[0]
        shown = f"| {r['a']} − {r['b']} |" in cell
        assert shown == (r["matched"] == "1"), (r["regime"], r["setting"], r["a"], r["b"])


def test_where_runs_collapse_the_counts_decide_with_fishers_test(tmp_path):
    """Hand-made runs with known p: FixMatch collapses at all 5 seeds, FixMatch-FedDPL at 1 (its
    differences are bimodal, one near 0): Fisher's exact test of 1 of 5 against 5 of 5 is
    p = 10 / 210 = 0.0476, and the comparison is decided on it, not on the t interval. The sign
    test beside it: 5 of 5 above, p = 2 / 32 = 0.0625."""
    for seed in range(5):
        fake_run(tmp_path, "fedavg", seed, 0.88, 0.8, 0.12)
        fake_run(tmp_path, "fixmatch", seed, 0.11, 0.0, 0.9, collapsed=True)
        dpl_final, dpl_collapsed = (0.12, True) if seed == 2 else (0.85 + seed / 100, False)
        fake_run(tmp_path, "fixmatch-feddpl", seed, dpl_final, 0.5, 0.2, collapsed=dpl_collapsed)
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    rows = {(r["a"], r["b"]): r for r in csv.DictReader((out / "claims.csv").open())}
    dpl = rows[("FixMatch-FedDPL, n_m", "FixMatch, n_m")]
    assert (dpl["collapsed_a"], dpl["collapsed_b"], dpl["decided_on_counts"]) == ("1", "5", "1")
    assert float(dpl["p_fisher"]) == pytest.approx(10 / 210)
    assert float(dpl["p_sign"]) == pytest.approx(2 / 32)
    # Holm over the two primary comparisons: SSL (5 of 5 collapsed against 0 of 5: 2 / 252) and DPL
    ssl = rows[("FixMatch, n_m", "FedAvg")]
    assert float(ssl["p_fisher"]) == pytest.approx(2 / 252) and ssl["verdict"] == "fails"
    assert float(dpl["p_holm"]) == pytest.approx(10 / 210) and dpl["verdict"] == "holds"
    md = (out / "claims.md").read_text()
    assert "holds (collapsed 1 of 5 vs 5 of 5, Fisher p 0.048, p_Holm 0.048)" in md


def test_the_sign_test_and_fishers_test_give_their_closed_forms():
    from feddb.stats import fisher, paired_test, sign_test, split

    assert sign_test(5, 0) == pytest.approx(0.0625) and sign_test(4, 1) == pytest.approx(0.375)
    assert sign_test(0, 0) == 1.0
    assert paired_test([78.1, 79.35, 2.05, 79.9, 81.65])["p_sign"] == pytest.approx(0.0625)
    assert paired_test([1.0, 0.0, -2.0])["p_sign"] == 1.0  # a tie carries no sign
    assert fisher(0, 5, 5, 5) == pytest.approx(2 / 252) and fisher(3, 5, 3, 5) == 1.0
    assert split(1, 5, 5, 5) and not split(5, 5, 5, 5) and not split(0, 5, 0, 5)


def test_pairs_on_two_machines_of_one_device_type_are_unmatched(tmp_path):
    """An H100 arm against an H200 arm (both "cuda"): another float order, so no pair."""
    for seed in range(3):
        fake_run(
            tmp_path,
            "fixmatch",
            seed,
            0.85,
            0.5,
            0.14,
            device="cuda:0",
            hardware="NVIDIA H100 80GB HBM3, 16 cores",
        )
        fake_run(
            tmp_path,
            "feddb-without-dpl",
            seed,
            0.90,
            0.5,
            0.14,
            device="cuda:0",
            hardware="NVIDIA H200, 16 cores",
        )
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    rows = {(r["a"], r["b"]): r for r in csv.DictReader((out / "claims.csv").open())}
    assert rows[("FedDB w/o DPL", "FixMatch, n_m")]["verdict"] == "unmatched"


def test_reports_ablation_leaves_out_dpl_with_the_global_prior():
    """The ablation table's "DPL ✓" is the paper's DPL (local prior); dpl_prior=global is another
    method and its runs are not counted under it."""
    from feddb.report import ablation_key

    local = compose(["method=fixmatch", "dpl=true"])
    assert ablation_key(local) == (True, False)
    assert ablation_key({**local, "dpl_prior": "global"}) is None


def test_a_reports_paired_table_decides_a_split_comparison_on_its_collapse_counts():
    from feddb.report import paired_table

    diffs = [78.1, 79.35, 2.05, 79.9, 81.65]
    row = {"setting": "s", "a": "FedDB w/o DPL", "b": "FixMatch", "seeds": 5, "diffs": diffs}
    row.update(mean=float(np.mean(diffs)), low=0.0, high=1.0, collapsed=(1, 5))
    line = paired_table([row], "the interval is")[2].split(" | ")
    assert line[7:10] == ["0.048", "0.062", "1 of 5; 5 of 5 (0.048)"]  # Holm of one: Fisher's p


def test_the_cause_study_tables_each_factor_against_the_exact_point(tmp_path):
    """Hand-made runs of the one-factor study: at the exact point FixMatch collapses at 5 of 5
    seeds and FixMatch-FedDPL at 0; with GroupNorm FixMatch collapses at 0 of 3 (Fisher against
    5 of 5: p = 1 / 56 = 0.018) and DPL changes it by +1 point at every seed (sign test p 0.25)."""

    def run(row, seed, final, collapsed, *extra):
        dpl = ["dpl=true"] if "feddpl" in row else []
        fake_run(
            tmp_path,
            row,
            seed,
            final,
            0.5,
            0.9 if collapsed else 0.2,
            warmup=0,
            regime="cause",
            collapsed=collapsed,
            experiment="miniature_authors_exact",
            extra=[*dpl, *extra],
        )

    for seed in range(5):
        run("fixmatch", seed, 0.11, True)
        run("fixmatch-feddpl", seed, 0.80, False)
    for seed in range(3):
        run("fixmatch-gn", seed, 0.90 + seed / 100, False, "model.norm=gn")
        run("fixmatch-feddpl-gn", seed, 0.91 + seed / 100, False, "model.norm=gn")
    for seed in range(4):  # a second factor: Holm over FixMatch's two factors
        run("fixmatch-joint", seed, 0.92, False, "train.forward=joint")
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    md = (out / "claims.md").read_text()
    section = md[md.index("## Collapse in the exact regime") :]
    assert "| the exact point | FixMatch | 5 | 5 of 5 | – | – | 11.00 ± 0.00 | – |" in section
    gn = next(
        line for line in section.splitlines() if line.startswith("| model.norm=gn | FixMatch |")
    )
    assert "| 3 | 0 of 3 | 0.018 | 0.018 | 91.00 ± 1.00 |" in gn  # Holm: the larger p, times 1
    assert (
        "| train.forward=joint | FixMatch | 4 | 0 of 4 | 0.008 | 0.016 | 92.00 ± 0.00 |" in section
    )
    assert (
        "+80.00 [+77.52, +82.48] (sign test p 0.250; 3 pairs); collapsed 0 vs 3, Fisher p 0.100"
        in gn
    )
    assert "| model.norm=gn | FixMatch-FedDPL − FixMatch | +1.00 [+1.00, +1.00]" in section
    assert (
        "| the exact point | FixMatch-FedDPL − FixMatch | +69.00 [+69.00, +69.00] (sign test p 0.062; 5 pairs); collapsed 0 vs 5, Fisher p 0.008 |"
        in section
    )
    assert "Provenance: 20 complete runs" in section
    lines = list(csv.DictReader((out / "runs.csv").open()))
    assert sum(r["regime"] == "cause" for r in lines) == 20


def test_an_lr_selection_is_tabled_with_the_lr_chosen_on_validation(tmp_path):
    for lr, acc in ((0.01, 0.80), (0.03, 0.86), (0.1, 0.84)):
        fake_run(
            tmp_path,
            f"fixmatch@lr={lr}",
            0,
            acc,
            0.5,
            0.14,
            regime="lr_test",
            extra=[f"train.lr={lr}"],
            selection={"key": "train.lr", "value": str(lr)},
        )
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    md = (out / "claims.md").read_text()
    assert "## The lr chosen on the validation split (lr_test)" in md
    assert "| δ=0.1 | fixmatch | 80.00 | 86.00 | 84.00 | 0.03 |" in md


def test_an_lr_within_a_standard_error_of_the_best_ties_towards_the_smaller():
    from studies.factors import chosen

    # 1000 validation images at 92.6 %: one standard error is 0.83 points
    assert chosen({0.03: 88.40, 0.1: 92.50, 0.3: 92.60}, 1000) == 0.1
    assert chosen({0.03: 88.40, 0.1: 91.70, 0.3: 92.60}, 1000) == 0.3
    assert chosen({0.03: 88.40, 0.1: 91.70, 0.3: 92.60}, 100) == 0.1  # a smaller split
    assert chosen({"bn": 90.0, "gn": 92.0}, 1000) == "gn"


def test_a_sweep_sets_the_lr_last_and_keeps_its_runs_apart():
    from omegaconf import OmegaConf

    from feddb.sweep import run_dir_of, with_value

    assert with_value("", "train.lr", 0.1) == "overrides='train.lr=0.1'"
    assert (
        with_value("num-server-rounds=2", "train.lr", 0.1)
        == "num-server-rounds=2 overrides='train.lr=0.1'"
    )
    merged = with_value("seed=1 overrides='train.tau=0.5'", "train.lr", 0.1)
    assert "train.tau=0.5 train.lr=0.1" in merged and "seed=1" in merged
    cfg = OmegaConf.create(
        {
            "out": "/tmp/x",
            "dataset": "mnist10k",
            "partition": "dir0.1",
            "row": "feddb",
            "seed": 0,
            "tune": "train.lr",
        }
    )
    assert run_dir_of(cfg).parent.name == "feddb"
    cfg.value = 0.03
    assert run_dir_of(cfg).parent.name == "feddb@lr=0.03"
    cfg.tune, cfg.value = "method.debias", 1.0
    assert run_dir_of(cfg).parent.name == "feddb@debias=1.0"


def test_a_method_parameter_is_selected_like_the_lr(tmp_path):
    for lam, acc in ((0.4, 0.80), (0.5, 0.805), (1.0, 0.70)):
        fake_run(
            tmp_path,
            f"debiaspl@debias={lam}",
            0,
            acc,
            0.5,
            0.14,
            regime="debias_test",
            extra=["method=debiaspl", f"method.debias={lam}"],
            selection={"key": "method.debias", "value": str(lam)},
        )
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    md = (out / "claims.md").read_text()
    assert "## The debias chosen on the validation split (debias_test)" in md
    assert "| δ=0.1 | debiaspl | 80.00 | 80.50 | 70.00 | 0.4 |" in md  # 0.5 within a standard error


def test_claims_refuse_a_seed_twice_in_a_cell_and_list_the_runs_left_out(tmp_path, capsys):
    for seed in (0, 1):
        fake_run(tmp_path, "fedavg", seed, 0.80, 0.5, 0.14)
        fake_run(tmp_path, "fixmatch", seed, 0.85, 0.5, 0.14)
    failed = fake_run(tmp_path, "feddb", 0, 0.85, 0.5, 0.14)
    (failed / "failure.json").write_text("{}")
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    assert f"- {failed}: failed (failure.json)" in (out / "claims.md").read_text()
    assert f"[claims] left out {failed}: failed" in capsys.readouterr().err
    fake_run(tmp_path, "fixmatch-again", 1, 0.85, 0.5, 0.14)  # FixMatch's seed 1 once more
    assert claims.main([str(tmp_path), "--out", str(out)]) == 2
    assert "seed 1 twice" in capsys.readouterr().err


def test_verdicts_that_move_with_holms_family_are_tabled_with_each_familys_p():
    def row(regime, setting, p):
        return {
            "regime": regime,
            "setting": setting,
            "claim": "SSL helps",
            "p": p,
            "on_counts": False,
            "primary": True,
            "matched": True,
        }

    rows = [
        row("cpu", "δ=0.1", 0.02),
        row("cpu", "IID", 0.5),
        row("authors", "δ=0.1", 0.3),
        row("authors", "IID", 0.4),
    ]
    ps, sizes = claims.family_holm(rows)
    assert sizes == {"regime": 2, "README cells": 1, "all": 4}
    first = ps[0]
    assert [first[n] for n in claims.FAMILIES] == pytest.approx([0.04, 0.02, 0.08])
    assert np.isnan(ps[1]["README cells"])  # IID is not a README cell
    text = "\n".join(claims.family_lines(rows))
    assert "| cpu | δ=0.1 | SSL helps | 0.040 | 0.020 | 0.080 |" in text
    assert "| cpu | IID |" not in text  # not significant under any family
    assert claims.family_lines(rows[1:])[-2] == "No verdict changes with the family."


def test_the_claims_name_their_plan_by_commit_and_each_regimes_family():
    lines = claims.plan_lines({"cpu", "exact_class", "newer"})
    assert lines[0].startswith("Plan: studies/plans/claims.yaml (")
    assert f"α = {claims.ALPHA}" in lines[0] and claims.ALPHA == 0.05
    assert lines[1].startswith("- cpu: family fixed after the runs")
    assert lines[2].startswith("- exact_class: family fixed before the runs")
    assert lines[3] == "- newer: not in the plan (its family was not fixed before its runs)."


def with_pseudo_labels(run_dir, right):
    """Gives a fake run's rounds two clients whose pseudo-labels are `right` of 10 for class 0
    (all 10 of class 1 right), and the partition's pools (client 0 skewed, client 1 not)."""
    rounds = [json.loads(x) for x in (run_dir / "metrics.jsonl").open()]
    for r in rounds:
        r["clients"] = [
            {
                "partition_id": pid,
                "app_u": [0.5, 0.5],
                "app_u_global": [0.5, 0.5],
                "pseudo_label_accuracy": (right + 10) / 20,
                "pseudo_label_histogram": [right, 20 - right],
                "pseudo_label_class_true": [10, 10],
                "pseudo_label_class_correct": [right, 10],
            }
            for pid in (0, 1)
        ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rounds))
    pools = {"unlabeled": [[90, 10], [50, 50]]}
    (run_dir / "partition_summary.json").write_text(json.dumps(pools))


def test_a_planned_regime_is_decided_by_its_plans_family_and_shows_its_pseudo_labels(tmp_path):
    """exact_class's family is the plan's three comparisons (studies/plans/claims.yaml), the
    global prior's included, and nothing else; its cells show the pseudo-labels by class and
    DPL's effect per client, by the client's skew."""
    assert claims.planned_families()["exact_class"][2] == [
        "FixMatch-FedDPL (global prior)",
        "FixMatch-FedDPL",
    ]
    exact = {"regime": "exact_class", "experiment": "miniature_authors_exact", "warmup": 0}
    for seed in range(3):
        fake_run(tmp_path, "fedavg", seed, 0.80 + seed / 100, 0.5, 0.14, **exact)
        d = fake_run(tmp_path, "fixmatch", seed, 0.90 + seed / 200, 0.7, 0.12, **exact)
        with_pseudo_labels(d, 6)
        d = fake_run(tmp_path, "fixmatch-feddpl", seed, 0.92 + seed / 150, 0.7, 0.12, **exact)
        with_pseudo_labels(d, 8)
        d = fake_run(tmp_path, "fixmatch-feddpl-global", seed, 0.92, 0.7, 0.12, **exact)
        with_pseudo_labels(d, 8)
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "claims.csv").open()))
    primary = {(r["a"], r["b"]) for r in rows if r["primary"] == "1"}
    assert primary == {
        ("FixMatch, uniform", "FedAvg"),
        ("FixMatch-FedDPL, uniform", "FixMatch, uniform"),
        ("FixMatch-FedDPL (global prior), uniform", "FixMatch-FedDPL, uniform"),
    }
    md = (out / "claims.md").read_text()
    assert "- exact_class: family fixed before the runs" in md
    assert "| 0 | 100.0 | 60.0 | 100.0 | 80.0 | 100.0 | 80.0 |" in md  # precision, right on class
    # the skewed client in each of 3 seeds: its clients descriptive, its seeds sign-tested
    assert "| 0.8–1.0 | 3 | +10.00 | 3 / 0 | 3 / 0 (sign test p 0.250) |" in md
    assert "| 0.5–0.8 | 3 | +10.00 | 3 / 0 | 3 / 0 (sign test p 0.250) |" in md
    assert "## Verdicts under other families" not in md or "exact_class |" not in md


def test_the_exact_point_in_the_authors_order_makes_the_older_runs_the_index_order_cell(tmp_path):
    """The cause study's exact point is exact_class's FixMatch runs (the preset in the authors'
    pool order); a cause run made before the project had `partition.pool_order` is read as index
    order, the factor it then flips besides its own."""

    def old(d):  # written before the key existed
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        del cfg["partition"]["pool_order"]
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))

    exact = {"warmup": 0, "experiment": "miniature_authors_exact"}
    for seed in range(3):
        fake_run(
            tmp_path,
            "fixmatch",
            seed,
            0.11,
            0.5,
            0.9,
            regime="exact_class",
            collapsed=True,
            **exact,
        )
        fake_run(tmp_path, "fedavg", seed, 0.80, 0.5, 0.2, regime="exact_class", **exact)
        old(fake_run(tmp_path, "fixmatch", seed, 0.92, 0.5, 0.2, regime="cause", **exact))
        extra = {**exact, "extra": ["train.forward=joint"]}
        old(fake_run(tmp_path, "fixmatch-joint", seed, 0.93, 0.5, 0.2, regime="cause", **extra))
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    md = (out / "claims.md").read_text()
    section = md[md.index("## Collapse in the exact regime") :]
    assert "| the exact point | FixMatch | 3 | 3 of 3 |" in section  # exact_class's, not FedAvg
    assert "| partition.pool_order=index | FixMatch | 3 | 0 of 3 | 0.100 |" in section
    joint = "| partition.pool_order=index, train.forward=joint | FixMatch | 3 | 0 of 3 | 1.000 |"
    assert joint in section  # against the index-order point: one factor flipped
    assert "| 93.00 ± 0.00 | +1.00 [+1.00, +1.00] (sign test p 0.250; 3 pairs) |" in section
    assert "FedAvg" not in section.split("## ")[1]


def test_a_regime_whose_name_holds_underscores_gets_its_figures_captions():
    """The claims study names its figures <regime>_<figure>; exact_class's are captioned as that
    regime's, not as an unnamed figure of a regime called "exact"."""
    md = embed([Path("exact_class_classes.png"), Path("cpu_pseudo_labels.png")])
    assert f"exact_class regime. {CAPTIONS['classes.png']}:" in md
    assert f"cpu regime. {CAPTIONS['pseudo_labels.png']}:" in md


def test_a_planned_family_keeps_its_size_when_a_comparison_has_no_p(tmp_path):
    """The plan fixes exact_class's family at three comparisons: with the global prior's runs at
    one seed (no p), the other two are still corrected over three, that one counted as p = 1."""
    exact = {"regime": "exact_class", "experiment": "miniature_authors_exact", "warmup": 0}
    for seed in range(3):
        fake_run(tmp_path, "fedavg", seed, 0.80 + seed / 100, 0.5, 0.14, **exact)
        fake_run(tmp_path, "fixmatch", seed, 0.90 + seed / 200, 0.7, 0.12, **exact)
        fake_run(tmp_path, "fixmatch-feddpl", seed, 0.85 + seed / 150, 0.7, 0.12, **exact)
    fake_run(tmp_path, "fixmatch-feddpl-global", 0, 0.92, 0.7, 0.12, **exact)
    out = tmp_path / "out"
    assert claims.main([str(tmp_path), "--out", str(out)]) == 0
    rows = [r for r in csv.DictReader((out / "claims.csv").open()) if r["primary"] == "1"]
    p = {r["a"].partition(",")[0]: float(r["p"]) for r in rows if r["p"] not in ("", "nan")}
    expected = holm([p["FixMatch"], p["FixMatch-FedDPL"], 1.0])
    got = {a: float(r["p_holm"]) for r in rows if (a := r["a"].partition(",")[0]) in p}
    assert got == pytest.approx({"FixMatch": expected[0], "FixMatch-FedDPL": expected[1]}, 1e-4)
    assert got != pytest.approx(dict(zip(p, holm(list(p.values())))), 1e-4)  # not a family of 2


def test_the_cause_study_pairs_a_cell_with_its_reference_excepting_only_the_factor_it_flips():
    assert factors.flipped("partition.pool_order=index, train.forward=joint") == ("train.forward",)
    assert factors.flipped("partition.pool_order=index") == ("partition.pool_order",)

"""The sweep command (Hydra multirun over the launcher) and the report command (tables, figures)."""

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_scenarios import check_partial_clients_rounds

from feddb import report
from fssl import identity
from server_app.config import compose

PROJECT = Path(__file__).resolve().parents[1]

STUB = f'''"""Stands in for the launcher: writes a complete run; fails for seed 1 of feddb."""
import json, pathlib, shlex, sys
sys.path.insert(0, {str(PROJECT)!r})
from feddb.launch import absolute_paths, parse_run_config
text = sys.argv[sys.argv.index("--run-config") + 1]
rc = dict(kv.split("=", 1) for kv in shlex.split(text))
out = pathlib.Path(rc.get("output-dir") or rc["resume"])
if rc.get("method") == "feddb" and rc.get("seed") == "1":
    sys.exit("boom")
out.mkdir(parents=True, exist_ok=True)
if "resume" not in rc:
    (out / "run_config.json").write_text(json.dumps(absolute_paths(parse_run_config(text))))
(out / "config.yaml").write_text("num_rounds: 2\\n")
(out / "summary.json").write_text(json.dumps({{"rounds": 2}}))
(out / "run_config").write_text(sys.argv[sys.argv.index("--run-config") + 1])
calls = out / "calls"
calls.write_text(str(int(calls.read_text()) + 1 if calls.exists() else 1))
'''


def sweep(tmp_path, *args, stub_text=STUB, jobs=1, env=None, out=None, launcher=None):
    """`feddb sweep` over a stub launcher (or `launcher`), writing to `out` (tmp_path/out)."""
    stub = tmp_path / "stub.py"
    stub.write_text(stub_text)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "feddb.sweep",
            "--jobs",
            str(jobs),
            "-m",
            *args,
            f"out={out or tmp_path / 'out'}",
            f"launcher={launcher or f'[python,{stub}]'}",
        ],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_sweep_runs_each_combination_skips_complete_ones_and_reports_failures(tmp_path):
    res = sweep(tmp_path, "row=fedavg,feddb", "seed=0,1")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "4 combinations: 3 run, 0 already complete, 1 failed" in res.stdout
    assert "FAILED feddb mnist10k_dir0.3 seed 1: exit 1" in res.stdout
    root = tmp_path / "out" / "mnist10k_dir0.3"
    for row, seed in (("fedavg", 0), ("fedavg", 1), ("feddb", 0)):
        assert (root / row / f"s{seed}" / "calls").read_text() == "1"
    assert "boom" in (root / "feddb" / "s1.log").read_text()
    status = [json.loads(line) for line in (tmp_path / "out" / "sweep_status.jsonl").open()]
    assert sorted((s["row"], s["seed"], s["status"]) for s in status) == [
        ("fedavg", 0, "done"),
        ("fedavg", 1, "done"),
        ("feddb", 0, "done"),
        ("feddb", 1, "failed"),
    ]
    again = sweep(tmp_path, "row=fedavg,feddb", "seed=0,1")
    assert "4 combinations: 0 run, 3 already complete, 1 failed" in again.stdout
    assert (root / "fedavg" / "s0" / "calls").read_text() == "1"  # not run twice
    assert (root / "feddb" / "s1.log").read_text().count("boom") == 2  # the log appended


NEIGHBOUR_STUB = STUB.replace(
    "calls = out",
    """status = out.parents[2] / "sweep_status.jsonl"  # a sweep beside this one, same folder
with open(status, "a") as f:
    f.write(json.dumps({"row": "fixmatch", "dataset": "mnist10k", "partition": "dir0.3",
        "seed": 7, "run_dir": "x", "time": 9e9, "sweep": "neighbour", "status": "failed",
        "reason": "exit 1"}) + "\\n")
calls = out""",
)


def test_a_sweep_asked_other_settings_refuses_the_old_run_or_runs_beside_it(tmp_path):
    """The same combination asked with another setting is not "already complete": refused with
    one line naming the key (exit 2), or with mismatch=beside run next to the old run."""
    assert sweep(tmp_path, "row=fixmatch", "seed=0").returncode == 0
    tau = "run_config=overrides='train.tau=0.5'"
    res = sweep(tmp_path, "row=fixmatch", "seed=0", tau)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "1 refused" in res.stdout and "already complete" in res.stdout
    assert "train.tau: - -> 0.5" in res.stdout and "0 already complete" in res.stdout
    runs = tmp_path / "out" / "mnist10k_dir0.3" / "fixmatch"
    assert (runs / "s0" / "calls").read_text() == "1"
    beside = sweep(tmp_path, "row=fixmatch", "seed=0", tau, "mismatch=beside")
    assert beside.returncode == 0 and "1 run" in beside.stdout, beside.stdout + beside.stderr
    (new,) = [p for p in runs.glob("s0+*") if p.is_dir()]
    assert "train.tau=0.5" in (new / "run_config").read_text()
    again = sweep(tmp_path, "row=fixmatch", "seed=0", tau, "mismatch=beside")
    assert "1 already complete" in again.stdout and (new / "calls").read_text() == "1"
    # the row and the selection travel with the run, for its identity
    assert "row='fixmatch'" in (runs / "s0" / "run_config").read_text()
    # a re-run sweep appends to the run's log
    assert (runs / "s0.log").read_text().count("=== ") == 1  # the refused sweep ran nothing
    assert (runs / f"{new.name}.log").read_text().count("=== ") == 1


LONG_STUB = STUB.replace("calls = out", "import time; time.sleep(8)\ncalls = out")


def test_two_sweeps_into_one_out_the_second_is_refused(tmp_path):
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "feddb.sweep",
            "-m",
            "row=fedavg",
            "seed=0",
            f"out={tmp_path / 'out'}",
            f"launcher=[python,{tmp_path / 'slow.py'}]",
        ],
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    (tmp_path / "slow.py").write_text(LONG_STUB)
    try:
        lock = tmp_path / "out" / ".sweep.lock"
        for _ in range(600):
            if lock.is_file() and lock.read_text().startswith("pid"):
                break
            time.sleep(0.1)
        second = sweep(tmp_path, "row=fedavg", "seed=0")
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"another sweep (pid {first.pid}) is writing into" in second.stderr
        assert first.wait(timeout=120) == 0
    finally:
        if first.poll() is None:
            first.kill()
    # the lock dies with its sweep: the next one runs
    assert sweep(tmp_path, "row=fedavg", "seed=0").returncode == 0


def test_a_sweep_counts_its_own_runs_not_those_of_a_sweep_beside_it(tmp_path):
    """Two sweeps into one folder share its status file; neither may count, or fail on, the
    other's runs (it did: "6/4" and exit 1 for the neighbour's failure)."""
    res = sweep(tmp_path, "row=fedavg", "seed=0,2", stub_text=NEIGHBOUR_STUB)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 combinations: 2 run, 0 already complete, 0 failed" in res.stdout
    assert "2/2" in res.stdout and "3/2" not in res.stdout and "FAILED" not in res.stdout


def test_sweep_rejects_an_unknown_row_before_any_run(tmp_path):
    res = sweep(tmp_path, "row=fedavg,fedbogus")
    assert res.returncode == 2 and "unknown row(s) ['fedbogus']" in res.stderr
    assert "fedavg, fixmatch, fedmatch" in res.stderr and not list(tmp_path.rglob("s0"))


def test_a_preset_sweeps_a_section_of_the_table_by_name(tmp_path):
    """`row: ${rows:methods}` in the paper presets: the section's rows, in its order, each a run."""
    res = sweep(
        tmp_path, "sweep=paper/cifar10_iid", "seed=0", "experiment=quick", "dataset=mnist10k"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "10 combinations: 10 run" in res.stdout
    ran = sorted(p.parent.name for p in (tmp_path / "out").rglob("s0") if p.is_dir())
    assert ran == sorted(
        yaml.safe_load((PROJECT / "conf/comparison/paper.yaml").read_text())["methods"]
    )


def test_the_old_lr_key_is_refused_pointing_to_value(tmp_path):
    res = sweep(tmp_path, "row=fedavg", "lr=0.03,0.1")
    assert res.returncode == 2 and "the sweep key lr is now value" in res.stderr
    assert not list(tmp_path.rglob("s0"))


def test_sweep_presets_compose():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import feddb.sweep  # noqa: F401 - registers ${rows:<section>}

    sweeps = str(PROJECT / "conf" / "sweeps")
    with initialize_config_dir(config_dir=sweeps, version_base=None):
        cfg = hydra_compose(
            config_name="config", overrides=["sweep=mnist_miniature"], return_hydra_config=True
        )
    paper = yaml.safe_load((PROJECT / "conf" / "comparison" / "paper.yaml").read_text())
    rows = list(paper["methods"])  # ${rows:methods} in every paper preset
    main = ["fedavg", "fixmatch", "fixmatch-feddpl", "feddb", "feddb-without-dpl"]
    assert cfg.hydra.sweeper.params["row"].split(",") == main
    assert cfg.hydra.sweeper.params["seed"] == "0,1,2,3,4" and cfg.experiment == "miniature"
    with initialize_config_dir(config_dir=sweeps, version_base=None):
        others = hydra_compose(
            config_name="config",
            overrides=["sweep=mnist_miniature_others"],
            return_hydra_config=True,
        )
    assert set(others.hydra.sweeper.params["row"].split(",")) | set(main) == set(rows) | {
        "feddb-without-dpl"
    }  # FedDB w/o DMA is FixMatch-FedDPL
    assert others.hydra.sweeper.params["seed"] == "0,1,2" and others.out == cfg.out
    experiments = {
        p.relative_to(PROJECT / "conf" / "experiment").with_suffix("").as_posix()
        for p in (PROJECT / "conf" / "experiment").rglob("*.yaml")
    }
    for preset in sorted((PROJECT / "conf" / "sweeps" / "sweep" / "paper").glob("*.yaml")):
        with initialize_config_dir(config_dir=sweeps, version_base=None):
            cfg = hydra_compose(
                config_name="config",
                overrides=[f"sweep=paper/{preset.stem}"],
                return_hydra_config=True,
            )
        params = cfg.hydra.sweeper.params
        assert params["row"].split(",") == rows and params["seed"] == "0,1,2,3", preset.name
        for d in params.get("dataset", cfg.dataset).split(","):  # every setting has a preset
            for p in params.get("partition", cfg.partition).split(","):
                cfg.dataset, cfg.partition = d, p
                assert cfg.experiment == f"paper/{d}_{p}" and cfg.experiment in experiments


@pytest.mark.parametrize(
    "preset", sorted(p.stem for p in (PROJECT / "conf/sweeps/sweep").glob("*.yaml"))
)
def test_every_preset_sweeps_known_rows_of_a_real_experiment(preset):
    """Each top-level preset composes; its rows are rows, its experiment and partitions compose,
    and the key a selection tunes is a key of that configuration."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from feddb.launch import parse_run_config
    from feddb.rows import table
    from fssl.checks import lookup
    from fssl.config import run_config_to_overrides

    with initialize_config_dir(config_dir=str(PROJECT / "conf" / "sweeps"), version_base=None):
        cfg = hydra_compose(
            config_name="config", overrides=[f"sweep={preset}"], return_hydra_config=True
        )
    params = cfg.hydra.sweeper.params
    names = str(params.get("row", cfg.row)).split(",")
    assert set(names) <= set(table())
    for part in str(params.get("partition", cfg.partition)).split(","):
        for name in names if "value" in params else names[:1]:
            given = parse_run_config(cfg.run_config or "")  # e.g. the preset's scenario
            given |= {"experiment": cfg.experiment, "partition": part}
            run = compose(run_config_to_overrides(given | {"method": table()[name].method}))
            parent, key = lookup(run, cfg.tune)
            assert key in parent, (name, cfg.tune)


def test_sweep_table_preset_runs_every_dataset_with_its_paper_experiment(tmp_path):
    res = sweep(tmp_path, "sweep=paper/table_dir0.1", "row=feddb", "seed=0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 combinations: 3 run, 0 already complete, 0 failed" in res.stdout
    for d in ("cifar10", "svhn", "cifar100"):
        rc = (tmp_path / "out" / f"{d}_dir0.1" / "feddb" / "s0" / "run_config").read_text()
        assert f"dataset='{d}' partition='dir0.1' experiment='paper/{d}_dir0.1'" in rc
    # dataset, partition and experiment are plain values of the sweep, not training config groups
    res = sweep(
        tmp_path,
        "dataset=svhn",
        "partition=iid",
        "experiment=paper/svhn_iid",
        "row=fedavg",
        # as the shell leaves `run_config="data-path='/data' overrides='a=1,b'"`: free text
        "run_config=data-path='/data' overrides='dataset.download=true,x'",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rc = (tmp_path / "out" / "svhn_iid" / "fedavg" / "s0" / "run_config").read_text()
    assert "dataset='svhn' partition='iid' experiment='paper/svhn_iid'" in rc
    assert "data-path='/data'" in rc and "dataset.download=true,x" in rc


# -- report -------------------------------------------------------------------------------------


def fake_run(root, name, method, seed, accs, extra=(), delta=0.3, dataset="mnist10k", rounds=None):
    cfg = compose([f"method={method}", f"seed={seed}", f"num_rounds={rounds or len(accs)}", *extra])
    cfg["partition"]["delta"] = delta
    cfg["partition"]["mode"] = "iid" if delta is None else "dirichlet"
    cfg["dataset"]["name"] = dataset
    d = root / f"{name}_s{seed}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = []
    for r, acc in enumerate(accs, 1):
        k = 10
        lines.append(
            json.dumps(
                {
                    "round": r,
                    "test_accuracy": acc,  # None: not evaluated (eval.every)
                    "class_accuracy": None if acc is None else list(np.linspace(0, 1, k) * acc),
                    "pseudo_label_accuracy": 0.5 + 0.01 * r,
                    "pseudo_label_ratio": 0.1 * r,
                    "js_divergence": 0.3 / r,
                    "js_divergence_labeled": 0.6,
                    "dma": {
                        "weight_entropy": 1.0 + 0.01 * r,
                        "weights": [0.2] * 5,
                        "loss_weights": 0.01,
                        "loss_uniform": 0.02,
                    }
                    if cfg["dma"]["enabled"]
                    else None,
                }
            )
        )
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return d


def test_report_tables_and_figures_from_hand_made_runs(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "a", "fixmatch", 0, [0.5, 0.7, 0.6])
    fake_run(runs, "a", "fixmatch", 1, [0.4, 0.8, 0.8])
    fake_run(runs, "b", "feddb", 0, [0.6, 0.9, 0.85])
    fake_run(runs, "b", "feddb", 1, [0.7, 0.95, 0.9])
    fake_run(runs, "c", "fixmatch", 0, [0.3, 0.9, 0.9], extra=["dpl=true"])
    fake_run(runs, "d", "fedavg", 0, [0.2, 0.3, 0.4], delta=0.1)
    fake_run(runs, "e", "feddb", 0, [0.1, 0.2, 0.2], extra=["dma.enabled=false"])  # = c's (DPL, -)
    fake_run(runs, "f", "fedavg", 0, [0.5, 0.6, 0.6], delta=None, dataset="cifar10")
    unfinished = fake_run(runs, "g", "fedrgd", 0, [0.5, 0.4], rounds=5)  # still running
    failed = fake_run(runs, "h", "semifl", 0, [0.5, 0.4])
    (failed / "failure.json").write_text("{}")
    torn = fake_run(runs, "i", "flexmatch", 0, [0.5, 0.4])
    (torn / "metrics.jsonl").write_text((torn / "metrics.jsonl").read_text()[:-40])
    broken = fake_run(runs, "j", "freematch", 0, [0.5, 0.4])
    (broken / "config.yaml").write_text("method: [unclosed\n")
    out = tmp_path / "rep"
    assert report.main([str(runs), "--out", str(out)]) == 0
    rows = {(r["setting"], r["method"]): r for r in csv.DictReader((out / "results.csv").open())}
    fm = rows[("mnist10k δ=0.3", "FixMatch")]
    assert fm["seeds"] == "2" and float(fm["best_mean"]) == pytest.approx(75.0)
    assert float(fm["best_std"]) == pytest.approx(np.std([70, 80], ddof=1), abs=1e-4)
    assert float(fm["final_mean"]) == pytest.approx(70.0)
    assert float(rows[("mnist10k δ=0.3", "FedDB")]["best_mean"]) == pytest.approx(92.5)
    assert float(rows[("mnist10k δ=0.1", "FedAvg")]["final_mean"]) == pytest.approx(40.0)
    assert rows[("cifar10 IID", "FedAvg")]["best_std"] == ""  # one seed: no std
    md = (out / "results.md").read_text()
    # the paper's layout: one table per partition (IID first), datasets across in the paper's order
    assert md.index("(%), IID:") < md.index("(%), δ=0.3:") < md.index("(%), δ=0.1:")
    assert md.count("| method | CIFAR10 | MNIST-10k |") == 6
    assert "| FedAvg | 60.00(–) | – |" in md and "| FixMatch-FedDPL | – | 90.00(–) |" in md
    d03 = md[
        md.index("Final test accuracy (%), δ=0.3") : md.index("Final test accuracy (%), δ=0.1")
    ]
    assert d03.index("| FixMatch |") < d03.index("| FixMatch-FedDPL") < d03.index("| FedDB |")
    assert "| FedDB | – | 87.50(3.54) |" in d03
    # failed, unfinished and unreadable runs: left out, each listed with its file, not counted
    assert "FedRGD" not in d03 and "SemiFL" not in md and "FlexMatch" not in md
    assert f"- {unfinished}: unfinished (round 2 of 5)" in md
    assert f"- {failed}: failed (failure.json)" in md
    assert f"- {torn}: unreadable (ValueError: metrics.jsonl:" in md
    assert f"- {broken}: unreadable (ValueError: config.yaml:" in md
    assert "Best test accuracy" not in md  # not a headline figure any more
    assert (
        "Each cell: seeds 0 (1 run); except" in md and "FixMatch @ mnist10k δ=0.3: seeds 0, 1" in md
    )
    # ablation: FixMatch-FedDPL and FedDB w/o DMA are one computation: a seed counts once
    assert (
        "| δ=0.3 | – | – | – | 70.00(14.14) |" in md and "| δ=0.3 | ✓ | ✓ | – | 87.50(3.54) |" in md
    )
    assert "| δ=0.3 | ✓ | – | – | 90.00(–) |" in md
    import matplotlib.image as mpimg

    for name in ("convergence", "class_accuracy", "pseudo_labels", "js_divergence", "dma_weights"):
        png = out / f"{name}.png"
        assert png.stat().st_size > 20_000, name
        img = mpimg.imread(png)
        assert img.std() > 0.05 and img.shape[0] > 300, name  # not blank


PLAN = """endpoint: final test accuracy
test: paired t-test over seeds, Holm over the family
alpha: 0.05
fixed: before the runs
family:
  - [FedDB, FixMatch]
"""


def test_a_reports_plan_sets_its_family_and_is_named_with_it(tmp_path, capsys):
    """`feddb report --plan`: the paired table is the plan's family alone (Holm over it), under
    the plan's line; a plan without a family, or naming a row none of the runs is, is refused."""
    runs, w = tmp_path / "runs", ["train.warmup_rounds=0"]
    for seed, (a, b, c) in enumerate([(0.5, 0.7, 0.8), (0.4, 0.6, 0.75), (0.45, 0.7, 0.72)]):
        fake_run(runs, "a", "fedavg", seed, [0.3, a], extra=w)
        fake_run(runs, "b", "fixmatch", seed, [0.3, b], extra=w)
        fake_run(runs, "c", "feddb", seed, [0.3, c], extra=w)
    plan, out = tmp_path / "plan.yaml", tmp_path / "rep"
    plan.write_text(PLAN)
    assert report.main([str(runs), "--out", str(out), "--plan", str(plan)]) == 0
    md = (out / "results.md").read_text()
    assert f"Plan: {plan} (not committed): final test accuracy; paired t-test" in md
    table = md[md.index("### Paired per-seed") : md.index("### Ablation")]
    assert "| FedDB − FixMatch | 3 | +10.00 +15.00 +2.00 |" in table
    assert table.count("| mnist10k δ=0.3 |") == 1  # FixMatch − FedAvg etc. are not in the family
    capsys.readouterr()
    for text, says in (
        (PLAN.replace("family:\n  - [FedDB, FixMatch]\n", ""), "lacks family"),
        (PLAN.replace("0.05", "5"), "alpha must be a number in (0, 1)"),
        (PLAN.replace("[FedDB, FixMatch]", "[FedDB, FixMatc]"), "names FixMatc, not among"),
        (PLAN.replace("final test", "mean test"), "the plan's endpoint 'mean test accuracy'"),
    ):
        plan.write_text(text)
        assert report.main([str(runs), "--out", str(tmp_path / "no"), "--plan", str(plan)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
        assert not (tmp_path / "no").exists()


def test_report_reads_runs_evaluated_every_few_rounds(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "a", "fixmatch", 0, [None, 0.6, None, 0.9, 0.8], extra=["eval.every=2"])
    out = tmp_path / "rep"
    assert report.main([str(runs), "--out", str(out)]) == 0
    row = next(csv.DictReader((out / "results.csv").open()))
    assert float(row["final_mean"]) == pytest.approx(80.0)
    assert float(row["best_mean"]) == pytest.approx(90.0)
    assert (out / "convergence.png").stat().st_size > 20_000


def test_report_names_runs_by_the_paper_rows():
    name = lambda *o: report.variant(compose(list(o)))  # noqa: E731
    assert name("method=fedavg") == "FedAvg" and name("method=feddb") == "FedDB"
    assert name("method=semifl", "dpl=true") == "SemiFL-FedDPL"
    assert name("method=feddb", "dma.enabled=false") == "FedDB w/o DMA"
    assert name("method=feddb", "dpl=false") == "FedDB w/o DPL"
    assert name("method=fixmatch", "dma.enabled=true") == "FixMatch+DMA"


def test_report_input_errors(tmp_path, capsys):
    assert report.main([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert report.main([str(tmp_path)]) == 2
    assert "no finished run" in capsys.readouterr().err


def identify(run_dir, row, config=None):
    """identity.json as a run writes it (fssl/identity.py), for a hand-made run."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    (run_dir / "identity.json").write_text(
        json.dumps(
            {
                "row": row,
                "row_from": "table",
                "selection": None,
                "regime": "quick",
                "config": config or identity.config_fingerprint(cfg),
                "dataset": "mnist10k",
                "partition": "dir0.3",
            }
        )
    )
    return run_dir


def test_a_report_names_each_row_apart_and_refuses_to_pool_settings_or_seeds(tmp_path, capsys):
    runs = tmp_path / "runs"
    identify(fake_run(runs, "a", "fixmatch", 0, [0.5, 0.6]), "fixmatch")
    identify(fake_run(runs, "b", "fixmatch", 0, [0.5, 0.7], ["model.norm=gn"]), "fixmatch-gn")
    out = tmp_path / "rep"
    assert report.main([str(runs), "--out", str(out)]) == 0
    md = (out / "results.md").read_text()
    assert "| FixMatch | 60.00(–) |" in md and "| FixMatch [fixmatch-gn] | 70.00(–) |" in md
    # one row, two settings: refused naming the key, or split by it
    identify(fake_run(runs, "c", "fixmatch", 1, [0.5, 0.8], ["train.tau=0.5"]), "fixmatch")
    capsys.readouterr()
    assert report.main([str(runs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "FixMatch @ mnist10k δ=0.3: its runs differ in train.tau" in err
    assert report.main([str(runs), "--out", str(out), "--split"]) == 0
    md = (out / "results.md").read_text()
    assert "| FixMatch {train.tau=0.95} |" in md and "| FixMatch {train.tau=0.5} |" in md
    # a seed twice under one row
    shutil.rmtree(runs / "c_s1")
    identify(fake_run(runs, "d", "fixmatch", 0, [0.5, 0.9]), "fixmatch")
    assert report.main([str(runs), "--out", str(out)]) == 2
    assert "FixMatch @ mnist10k δ=0.3: seed 0 twice" in capsys.readouterr().err


def test_report_colours_pair_each_method_with_its_dpl_variant():
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"]
    col = report.colours(
        ["FixMatch", "FedDB", "SemiFL-FedDPL", "FixMatch-FedDPL", "Mine", "SemiFL"]
    )
    assert col["FixMatch"] == tab20(0) and col["FixMatch-FedDPL"] == tab20(1)  # dark, light
    assert col["SemiFL"] == tab20(8) and col["SemiFL-FedDPL"] == tab20(9)
    assert len(set(col.values())) == 6  # an unknown variant gets its own
    assert report.dashes("SemiFL-FedDPL") == "--" and report.dashes("FedDB") == "-"


def test_trailing_means_average_the_last_rounds_only():
    from feddb.report import trailing_mean

    v = np.array([1.0, 3.0, 5.0, 7.0])
    assert trailing_mean(v, 2).tolist() == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean(v, 1) is v and trailing_mean(v, 9).tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(
    "preset",
    [
        "claims_cpu",
        "claims_authors",
        "claims_cpu_more",
        "claims_authors_more",
        "claims_exact",
        "claims_exact_literal",
    ],
)
def test_the_claims_presets_run_known_rows_in_whole_seeds(preset):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from feddb.sweep import rows

    with initialize_config_dir(config_dir=str(PROJECT / "conf" / "sweeps"), version_base=None):
        cfg = hydra_compose(
            config_name="config", overrides=[f"sweep={preset}"], return_hydra_config=True
        )
    params = cfg.hydra.sweeper.params
    assert list(params)[0] == "seed"  # seeds outermost: an interrupted sweep
    assert set(params["row"].split(",")) <= set(rows())  # leaves whole seeds
    for part in params["partition"].split(","):
        compose([f"experiment={cfg.experiment}", f"partition={part}"])  # valid configurations
    assert cfg.out == f"runs/claims/{preset.split('_')[1]}"


SLOW_STUB = '''"""Stands in for the launcher: a complete run that takes a second, with its thread count."""
import json, os, pathlib, shlex, sys, time
rc = dict(kv.split("=", 1) for kv in shlex.split(sys.argv[sys.argv.index("--run-config") + 1]))
out = pathlib.Path(rc["output-dir"])
out.mkdir(parents=True, exist_ok=True)
start = time.time()
time.sleep(1.5)
(out / "config.yaml").write_text("num_rounds: 2\\n")
(out / "summary.json").write_text(json.dumps({"rounds": 2}))
(out / "span.json").write_text(json.dumps({"start": start, "end": time.time(),
                                           "threads": os.environ.get("OMP_NUM_THREADS")}))
'''


def test_sweep_jobs_run_side_by_side_each_with_its_share_of_the_threads(tmp_path):
    import os

    from feddb import sweep as sweep_module

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    res = sweep(tmp_path, "row=fedavg,feddb", stub_text=SLOW_STUB, jobs=2, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 combinations: 2 run, 0 already complete, 0 failed" in res.stdout
    root = tmp_path / "out" / "mnist10k_dir0.3"
    spans = [
        json.loads((root / row / "s0" / "span.json").read_text()) for row in ("fedavg", "feddb")
    ]
    assert max(s["start"] for s in spans) < min(s["end"] for s in spans)  # they overlapped
    share = str(max(1, sweep_module.cores() // 2))
    assert all(s["threads"] == share for s in spans)
    assert sweep_module.split_jobs(["--jobs=3", "-m", "seed=0,1"]) == (3, ["-m", "seed=0,1"])
    assert sweep_module.split_mps(["--mps", "-m", "seed=0"]) == (True, ["-m", "seed=0"])
    assert sweep_module.split_mps(["-m", "seed=0"]) == (False, ["-m", "seed=0"])
    assert sweep_module.quote_free_text(
        ["run_config=a='1' b=2", "run_config='x=1'", 'launcher_args=--y "z"', "seed=0,1"]
    ) == ["run_config=\"a='1' b=2\"", "run_config='x=1'", 'launcher_args="--y \\"z\\""', "seed=0,1"]
    assert sweep_module.split_jobs(["--jobs", "auto"])[0] == sweep_module.auto_jobs() >= 1
    with pytest.raises(SystemExit) as stop:  # one line on stderr, exit 2
        sweep_module.split_jobs(["--jobs", "0"])
    assert stop.value.code == 2


def test_sweep_mps_without_the_driver_says_what_is_missing(monkeypatch):
    import feddb.resources
    import feddb.sweep as sweep_module

    monkeypatch.setattr(feddb.resources.shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "argv", ["feddb sweep", "--mps", "-m", "seed=0"])
    with pytest.raises(SystemExit, match="nvidia-cuda-mps-control is not on PATH"):
        sweep_module.main()


@pytest.mark.slow
def test_a_sweeps_results_do_not_depend_on_how_many_run_at_once(tmp_path):
    """A real in-process run alone, and the same run beside another, one thread each: the same
    metrics.jsonl (a run's arithmetic depends on its thread count, not on its neighbours)."""
    import os

    from localgrid import metrics_without_timing

    def run(rows, jobs):
        out = tmp_path / f"jobs{jobs}"
        res = sweep(
            tmp_path,
            f"row={rows}",
            "run_config=num-server-rounds=2 overrides='fl.fraction_train=0.2 train.local_steps=4 model.width=8'",
            jobs=jobs,
            out=out,
            launcher="[python,-m,feddb.inprocess]",
            env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        return metrics_without_timing(out / "mnist10k_dir0.3" / "feddb" / "s0")

    alone, beside = run("feddb", 1), run("fixmatch,feddb", 2)
    assert alone == beside and len(alone) == 2


def test_the_throughput_projection_counts_batches_of_concurrent_runs():
    from benchmarks.throughput import main, projected_sweep_seconds

    m = {"startup_seconds": 10.0, "round_seconds": 2.0}
    # 43 runs of 80 rounds: 43 batches one at a time, 22 with two side by side
    assert projected_sweep_seconds(m, 1, 43, 80) == 43 * 170.0
    assert projected_sweep_seconds(m, 2, 43, 80) == 22 * 170.0
    with pytest.raises(SystemExit):
        main(["--jobs", "one,two"])


def test_the_floor_counts_a_sweeps_runs_and_a_run_from_three_short_ones(tmp_path):
    from benchmarks.floor import counted_flops, run_flops, sweep_rows

    rows = sweep_rows(["mnist_miniature", "mnist_miniature_others"])
    assert sum(r["runs"] for r in rows) == 43 and len(rows) == 11
    assert all("experiment='miniature'" in r["run_config"] for r in rows)
    with pytest.raises(
        SystemExit,
        match="no sweep preset 'nope'; choose from cause_exact, cause_exact_more, ",
    ):
        sweep_rows(["nope"])
    tiny = (
        "fl.num_clients=20 fl.fraction_train=0.1 dataset.num_labeled=40 train.local_steps=2 "
        "train.batch_size=8 train.mu=2 train.tau=0.5 dataset.val_size=0 logging.tensorboard=false"
    )
    overrides = f"{tiny} train.warmup_rounds=1"  # one labels-only round, then semi-supervised
    est = run_flops(
        f"method='feddb' experiment='quick' partition='iid' num-server-rounds=4 "
        f"overrides='{overrides}'",
        tmp_path,
    )
    assert est["semi_round"] > est["warmup_round"] > 0  # the unlabeled images' steps
    exact = counted_flops(
        {
            "method": "feddb",
            "experiment": "quick",
            "partition": "iid",
            "seed": 0,
            "num-server-rounds": 4,
            "output-dir": str(tmp_path / "exact"),
            "overrides": overrides,
        }
    )
    assert est["run"] == pytest.approx(exact, rel=0.02)


def test_a_list_or_one_quoted_value_is_not_a_sweep_in_the_progress_count():
    from feddb.sweep import count_jobs

    task = ["row=a,b", "seed=0,1,2", "launcher=[python,stub.py]", "run_config='x=1,2'"]
    assert count_jobs({}, task) == 6
    assert count_jobs({"seed": "range(3)"}, []) == 0  # cannot tell


def interrupted_run(run, overrides: list[str], nodes: bool) -> None:
    """A run directory as a stop leaves it: its config.yaml and a checkpoint that holds the
    nodes' states (`nodes`, written in process) or not."""
    from fssl import checkpoint

    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(compose(overrides)))
    checkpoint.save(run, {"global": {"w": np.zeros(2, np.float32)}}, {"round": 3, "nodes": nodes})


def test_an_interrupted_run_whose_clients_keep_state_resumes_only_where_it_gets_it_back(tmp_path):
    """What clients keep between rounds (momentum, estimates) lives on the nodes: a checkpoint
    holds it only when written in process, and only an in-process launcher gives it back; else
    the sweep starts the run again, its partial directory kept beside it. A run whose clients
    keep nothing resumes from any checkpoint."""
    from feddb.sweep import resumable

    momentum = ["method=fixmatch", "train.optimizer_state=client"]
    cases = [  # (name, overrides, checkpoint holds the nodes, in process, resumed)
        ("nothing-kept", ["method=fedavg"], False, False, True),
        ("momentum-held", momentum, True, True, True),
        ("momentum-held-flwr", momentum, True, False, False),
        ("momentum-lost", momentum, False, True, False),
        ("estimates-lost", ["method=flexmatch"], False, True, False),
        ("teacher-held", ["method=rscfed", "scenario=labels_at_partial_clients"], True, True, True),
    ]
    for name, overrides, nodes, in_process, expected in cases:
        run = tmp_path / name / "s0"
        interrupted_run(run, overrides, nodes)
        assert resumable(run, in_process) is expected, name
        assert run.is_dir() is expected, name
        assert (tmp_path / name / "s0.interrupted" / "checkpoint.pt").is_file() is not expected
    # through a sweep whose launcher is not in process: restarted with a fresh run-config, or
    # resumed (`resume=`)
    root = tmp_path / "out" / "mnist10k_dir0.3"
    interrupted_run(root / "fixmatch" / "s0", momentum, True)
    interrupted_run(root / "fedavg" / "s0", ["method=fedavg"], False)
    res = sweep(tmp_path, "row=fixmatch,fedavg", "seed=0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "resume=" not in (root / "fixmatch" / "s0" / "run_config").read_text()
    assert (root / "fixmatch" / "s0.interrupted" / "checkpoint.pt").is_file()
    assert (root / "fedavg" / "s0" / "run_config").read_text().startswith("resume=")


def test_sweep_help_lists_the_sweeps_own_flags_and_hydras():
    res = subprocess.run(
        [sys.executable, "-m", "feddb.sweep", "--help"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "--jobs N|auto" in res.stdout and "--mps" in res.stdout
    assert "powered by Hydra" in res.stdout  # Hydra's own help follows


def test_a_failed_run_is_not_complete_and_a_sweep_runs_it_again(tmp_path):
    """A run that ended with failure.json (a round trained no client, exit 3) is not skipped:
    `complete` is false, so the next sweep runs it again, its directory kept as <seed>.failed."""
    import yaml

    from feddb.sweep import complete

    run = tmp_path / "s0"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"rounds": 2}))
    (run / "config.yaml").write_text(yaml.safe_dump({"num_rounds": 2}))
    assert complete(run)
    (run / "failure.json").write_text("{}")
    assert not complete(run)


def test_the_row_check_reads_plain_lists_and_leaves_hydras_grammar_to_hydra():
    from feddb.sweep import swept_rows

    assert swept_rows({"row": "fedavg,feddb"}, []) == ["fedavg", "feddb"]
    assert swept_rows({"row": "fedavg"}, ["row=fixmatch,/x/m.py:Mine"]) == [
        "fixmatch",
        "/x/m.py:Mine",
    ]
    assert swept_rows({}, ["row=choice(fedavg,feddb)"]) == []
    assert swept_rows({}, ["row='fedavg',feddb"]) == []


def sweep_and_report(tmp_path, rows: str, seeds: str, run_config: str) -> Path:
    """Real in-process runs of `rows` x `seeds` (experiment=quick) through `feddb sweep`, then
    `feddb report` over them; returns the report's directory."""
    res = sweep(
        tmp_path,
        f"row={rows}",
        f"seed={seeds}",
        "experiment=quick",
        f"run_config={run_config}",
        launcher="[python,-m,feddb.inprocess]",
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = tmp_path / "rep"
    assert report.main([str(tmp_path / "out"), "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_a_sweep_reports_each_row_as_its_own_cell(tmp_path):
    """Real runs in process (as `feddb local` runs them: two rounds, the labels at two of four
    clients, the scenario set by the sweep's run_config): fixmatch-gn and feddb-literal-dma are
    cells of their own, not pooled under FixMatch and FedDB (they were: "seeds 0, 0"); RSCFed's
    and CBAFed's rounds are their own, and the report gives the labeled clients' weight and the
    worst class."""
    tiny = (
        "scenario='labels_at_partial_clients' num-server-rounds=2 overrides='fl.num_clients=4 "
        "fl.fraction_train=1.0 dataset.num_labeled=100 train.local_epochs=1 model.width=8 "
        "train.warmup_rounds=1'"
    )
    rows = ("fixmatch", "fixmatch-gn", "feddb", "feddb-literal-dma", "rscfed", "cbafed")
    out = sweep_and_report(tmp_path, ",".join(rows), "0", tiny)
    cells = {r["method"]: r["seeds"] for r in csv.DictReader((out / "results.csv").open())}
    assert cells == {
        "FixMatch": "1",
        "FixMatch [fixmatch-gn]": "1",
        "FedDB": "1",
        "FedDB, literal DMA": "1",
        "RSCFed": "1",
        "CBAFed": "1",
    }
    runs = csv.DictReader((out / "runs.csv").open())
    assert sorted((r["row"], r["seed"]) for r in runs) == sorted((row, "0") for row in rows)
    md = (out / "results.md").read_text()
    assert (tmp_path / "out" / ".hydra").is_dir() and ".hydra" not in md  # not a run left out
    section = md[md.index("### The labels at a few clients") :].split("\n\n")[1]
    for method in ("rscfed", "cbafed"):
        run = tmp_path / "out" / "mnist10k_dir0.3" / method / "s0"
        rounds = [json.loads(line) for line in (run / "metrics.jsonl").open()]
        check_partial_clients_rounds(method, rounds)
        # the labeled clients' (partitions 0 and 1) weight in round 2, the final worst class
        share = sum(c["weight"] for c in rounds[1]["clients"] if c["partition_id"] < 2)
        worst = min(rounds[1]["class_accuracy"])
        row = f"| {report.variant(yaml.safe_load((run / 'config.yaml').read_text()))} | "
        assert f"{row}{100 * share:.2f}(–) | {100 * worst:.2f}(–) | 1 |" in section, section


HANGING_STUB = '''"""Stands in for a launcher that started a process of its own in a session of its own (as
`flwr run` does its SuperLink) and then waits: writes that process's pid and its own."""
import pathlib, subprocess, sys, time
out = pathlib.Path(sys.argv[sys.argv.index("--run-config") + 1].split("output-dir='")[1].split("'")[0])
out.mkdir(parents=True, exist_ok=True)
child = subprocess.Popen(["sleep", "300"], start_new_session=True)
(out.parent / "pids").write_text(f"{child.pid} {__import__('os').getpid()}")
time.sleep(300)
'''


@pytest.mark.parametrize("signum", ["SIGHUP", "SIGINT"])
def test_a_stopped_sweep_stops_its_runs_and_what_they_started(tmp_path, signum):
    """`feddb sweep` sent SIGHUP (a closed terminal) or SIGINT (Ctrl-C) while a run goes: the
    launcher and the process it started in a session of its own (the sweep's id in their
    environment) end, and one line, no traceback, says how to go on; exit 128 + the signal."""
    import os
    import signal
    import time

    from fssl.profiling import alive

    stub = tmp_path / "stub.py"
    stub.write_text(HANGING_STUB)
    proc = subprocess.Popen(
        [sys.executable, "-m", "feddb.sweep", "-m", "row=fedavg", "seed=0"]
        + [f"out={tmp_path / 'out'}", f"launcher=[python,{stub}]"],
        cwd=PROJECT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = tmp_path / "out" / "mnist10k_dir0.3" / "fedavg" / "pids"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (pids.is_file() and pids.read_text()):
        time.sleep(0.1)
    child, launcher = map(int, pids.read_text().split())
    sig = getattr(signal, signum)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert not alive(child) and not alive(launcher)
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted; resume with: feddb sweep -m row")


def test_a_sweep_whose_rounds_all_fall_in_the_warm_up_says_so_before_its_runs(tmp_path):
    """experiment=quick warms up for 10 labels-only rounds: 3 rounds of FixMatch are all warm-up
    (one warning line naming the keys, the runs go on); FedAvg, or 20 rounds, are not."""
    res = sweep(tmp_path, "row=fixmatch,fedavg", 'run_config="num-server-rounds=3"')
    assert res.returncode == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: row(s) fixmatch: all 3 rounds")
    assert "num-server-rounds" in warnings[0] and "train.warmup_rounds" in warnings[0]
    assert len(list((tmp_path / "out").rglob("s0"))) == 2  # both ran
    res = sweep(tmp_path, "row=fixmatch", 'run_config="num-server-rounds=20"', out=tmp_path / "o2")
    assert res.returncode == 0 and "warning: " not in res.stderr

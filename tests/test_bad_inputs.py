"""Every bad input gets one clear line and exit 2 before any process starts, names the key or file,
and leaves the run directory as it was. The table in docs/running/bad_inputs.md is this test's
table; `FEDDB_WRITE_DOCS=1 pytest tests/test_bad_inputs.py` writes it there after a change."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from feddb.inprocess import main as local_main
from feddb.launch import main as run_main

PROJECT = Path(__file__).resolve().parents[1]
DOC = PROJECT / "docs" / "running" / "bad_inputs.md"
BEGIN, END = "<!-- bad-inputs: begin -->", "<!-- bad-inputs: end -->"


def digits(tmp: Path, name: str, **change) -> Path:
    """A small valid .npz with some arrays replaced."""
    from fssl.data import embedded_candidates

    src = np.load(next(p for p in embedded_candidates() if p.is_file()))
    arrays = {
        "x_train": src["x_train"][:1000],
        "y_train": src["y_train"][:1000].copy(),
        "x_test": src["x_test"][:200],
        "y_test": src["y_test"][:200],
    }
    arrays.update(change)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    path = tmp / name
    np.savez(path, **arrays)
    return path


def stray_label(tmp: Path) -> Path:
    src = np.load(digits(tmp, "plain.npz"))
    y = src["y_train"].copy()
    y[0] = 10  # one image labelled K: K = 11 read from the data, class 10 has one image
    return digits(tmp, "stray.npz", y_train=y)


def truncated(tmp: Path) -> Path:
    good = digits(tmp, "whole.npz").read_bytes()
    (tmp / "cut.npz").write_bytes(good[: len(good) // 2])
    return tmp / "cut.npz"


def flipped(tmp: Path) -> Path:
    data = bytearray(digits(tmp, "whole2.npz").read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside the first array's stored bytes
    (tmp / "flipped.npz").write_bytes(bytes(data))
    return tmp / "flipped.npz"


def text_file(tmp: Path) -> Path:
    (tmp / "notes.npz").write_text("x_train,y_train\n1,2\n")
    return tmp / "notes.npz"


def objects(tmp: Path) -> Path:
    labels = np.array([{"label": i % 10} for i in range(1000)], dtype=object)
    return digits(tmp, "objects.npz", y_train=labels)


def run_with(tmp: Path, name: str, steps: int = 0) -> Path:
    """A run directory with a config and metrics (and checkpoints made bad by `steps`)."""
    from fssl import checkpoint
    from server_app.config import compose

    run = tmp / name
    run.mkdir()
    import yaml

    (run / "config.yaml").write_text(yaml.safe_dump(compose(["num_rounds=4"])))
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    if steps:
        checkpoint.save(run, {"global": {"w": np.ones(2)}}, {"round": 1})
        checkpoint.save(run, {"global": {"w": np.ones(2)}}, {"round": 2})
        for f in (checkpoint.FILE, checkpoint.PREVIOUS):
            data = (run / f).read_bytes()
            (run / f).write_bytes(data[: len(data) // 2])
    return run


def foreign_dir(tmp: Path) -> Path:
    """A directory of the user's own files, no run in it (metrics.jsonl among them)."""
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("my notes\n")
    (tmp / "mine" / "metrics.jsonl").write_text('{"mine": 1}\n')
    return tmp / "mine"


def never_started(tmp: Path) -> Path:
    """What a run that failed at start-up leaves: its configuration, no round."""
    run = run_with(tmp, "startup")
    (run / "metrics.jsonl").write_text("")
    return run


def identified(tmp: Path, name: str, data: str | None = None, writer: str = "mine") -> Path:
    """A run with its identity and a checkpoint that `writer` wrote; `data`: the data's
    fingerprint it records (default: the data's own)."""
    import json

    import yaml

    from fssl import checkpoint, identity
    from fssl.data import load_dataset

    run = run_with(tmp, name)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    ident = {
        "row": "feddb",
        "config": identity.config_fingerprint(cfg),
        "data": data or identity.data_fingerprint(load_dataset(cfg["dataset"])),
        "run": "mine",
    }
    (run / identity.FILE).write_text(json.dumps(ident))
    checkpoint.save(run, {"global": {"w": np.ones(2)}}, {"round": 1, "run": writer})
    return run


def finished(tmp: Path, name: str, seed: int, *overrides: str) -> Path:
    """A finished one-round run of FixMatch (a table's input)."""
    import yaml

    from server_app.config import compose

    run = tmp / name
    run.mkdir(parents=True)
    cfg = compose(["method=fixmatch", "num_rounds=1", f"seed={seed}", *overrides])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    record = '{"round": 1, "test_accuracy": 0.5, "class_accuracy": [0.5, 0.5]}\n'
    (run / "metrics.jsonl").write_text(record)
    return run


def two_settings(tmp: Path) -> Path:
    finished(tmp, "runs/a", 0)
    finished(tmp, "runs/b", 1, "train.tau=0.5")
    return tmp / "runs"


def a_seed_twice(tmp: Path) -> Path:
    finished(tmp, "runs/a", 0)
    finished(tmp, "runs/b", 0)
    return tmp / "runs"


HELD: list = []  # lock files held for the rest of the session (a sweep still running)


def held_out(tmp: Path) -> Path:
    """A sweep's out that another sweep is writing into (its lock held here)."""
    from feddb.sweep import lock_out

    assert lock_out(tmp / "busy") is None
    from feddb import sweep

    HELD.append(sweep.HELD.pop())  # not this test's sweep's own: it must find it taken
    HELD[-1].truncate(0)
    HELD[-1].write("pid 4242")  # the other sweep's pid, as the table shows it
    HELD[-1].flush()
    return tmp / "busy"


def a_file(tmp: Path, name: str = "afile", text: str = "not a directory\n") -> Path:
    (tmp / name).write_text(text)
    return tmp / name


def failing_strategy(tmp: Path) -> Path:
    """A user's strategy whose constructor raises."""
    (tmp / "my_strategy.py").write_text(
        "from flwr.serverapp.strategy import FedAvg\n\n\n"
        "class Fragile(FedAvg):\n"
        "    def __init__(self, **kwargs):\n"
        "        raise RuntimeError('no GPU budget configured')\n"
    )
    return tmp / "my_strategy.py"


def runs_table(tmp: Path) -> Path:
    """A valid runs.csv with one run (seed 0)."""
    from feddb.runlist import FIELDS

    row = dict.fromkeys(FIELDS, "")
    row.update(regime="cpu", row="fedavg", seed="0", final="90.00", run_config="{}")
    lines = [",".join(FIELDS), ",".join(f'"{row[f]}"' for f in FIELDS)]
    return a_file(tmp, "runs.csv", "\n".join(lines) + "\n")


def exiting_method(tmp: Path) -> Path:
    """A user's method file that calls sys.exit(0) at import (without the check, exit 0, no run)."""
    (tmp / "exiting_method.py").write_text("import sys\n\nsys.exit(0)\n")
    return tmp / "exiting_method.py"


def plain_class(tmp: Path) -> Path:
    """A user's file whose class is not a method (no hooks)."""
    (tmp / "plain_method.py").write_text("class Plain:\n    pass\n")
    return tmp / "plain_method.py"


# (area, what is wrong, run-config or a function of the temporary directory giving one, the word
# the message must name, the command: local (feddb local) or run (feddb run))
CASES = [
    ("run-config", "an unknown key", "lrr=0.1", "lrr"),
    ("run-config", "an unquoted string", "dpl=maybe", "dpl"),
    ("run-config", "a bare word", "seed=1 dpl", "dpl"),
    ("run-config", "an empty value", "seed=", "seed"),
    ("run-config", "an unbalanced quote", "overrides='train.lr=0.1", "overrides"),
    ("run-config", "negative rounds", "num-server-rounds=-3", "num-server-rounds"),
    ("run-config", "an unknown method", "method='fedbogus'", "method"),
    ("run-config", "an unknown partition", "partition='dir0.7'", "partition"),
    ("run-config", "an unknown experiment", "experiment='huge'", "experiment"),
    ("run-config", "an unknown dataset", "dataset='imagenet'", "dataset"),
    ("run-config", "an unknown model", "model='resnet'", "model"),
    ("run-config", "an unknown scenario", "scenario='labels_nowhere'", "scenario"),
    ("run-config", "an unknown strategy", "strategy='fedbogus'", "strategy"),
    ("run-config", "a seed that is a string", "seed='one'", "seed"),
    ("run-config", "a seed numpy cannot take (2**32)", "seed=4294967296", "seed"),
    ("overrides", "a key that does not exist", "overrides='train.lrr=0.1'", "train.lrr"),
    ("overrides", "a key added with +", "overrides='+train.lrr=0.1'", "train.lrr"),
    ("overrides", "a key added with ++", "overrides='++dma.stepz=5'", "dma.stepz"),
    ("overrides", "tau above 1", "overrides='train.tau=1.5'", "train.tau"),
    ("overrides", "a negative lr", "overrides='train.lr=-0.1'", "train.lr"),
    ("overrides", "no clients", "overrides='fl.num_clients=0'", "fl.num_clients"),
    ("overrides", "an unknown training mode", "overrides='train.mode=huge'", "train.mode"),
    ("overrides", "an unknown DMA mode", "overrides='dma.mode=fast'", "dma.mode"),
    ("overrides", "a fraction above 1", "overrides='fl.fraction_train=1.5'", "fl.fraction_train"),
    ("overrides", "a custom strategy without a class", "strategy='custom'", "strategy.target"),
    ("overrides", "an unknown DPL prior", "overrides='dpl_prior=server'", "dpl_prior"),
    (
        "overrides",
        "a global DPL prior without DPL",
        "method='fixmatch' overrides='dpl_prior=global'",
        "dpl_prior",
    ),
    (
        "methods",
        "a user method that does not import",
        "method='no_such_pkg.mod:Mine'",
        "no_such_pkg",
    ),
    (
        "methods",
        "a user method file that is not there",
        lambda t: f"method='{t}/mine.py:Mine'",
        "mine.py",
    ),
    (
        "methods",
        "a user class without the method hooks",
        lambda t: f"method='{plain_class(t)}:Plain'",
        "Plain lacks",
    ),
    (
        "methods",
        "a user method file that exits at import",
        lambda t: f"method='{exiting_method(t)}:Mine'",
        "exits at import",
    ),
    (
        "methods",
        "a user class that is not in its file",
        lambda t: f"method='{plain_class(t)}:Missing'",
        "Missing",
    ),
    ("methods", "a custom method without a class", "method='custom'", "method.trainer"),
    ("methods", "a method outside its scenario", "method='cbafed'", "scenario"),
    (
        "methods",
        "a switch the method refuses",
        "method='rscfed' scenario='labels_at_partial_clients' dpl=true",
        "dpl",
    ),
    (
        "strategies",
        "a user weighting that is not a Weighting",
        lambda t: f"overrides='server.weighting=\"{plain_class(t)}:Plain\"'",
        "server.weighting",
    ),
    (
        "strategies",
        "a user robust rule file that is not there",
        lambda t: f"overrides='server.robust.rule=\"{t}/rule.py:Mine\"'",
        "server.robust.rule",
    ),
    (
        "data files",
        "a missing file",
        lambda t: f"dataset='npz' data-path='{t}/nothing.npz'",
        "nothing.npz",
    ),
    (
        "data files",
        "a truncated .npz",
        lambda t: f"dataset='npz' data-path='{truncated(t)}'",
        "cut.npz",
    ),
    (
        "data files",
        "an .npz with flipped bytes",
        lambda t: f"dataset='npz' data-path='{flipped(t)}'",
        "flipped.npz",
    ),
    (
        "data files",
        "a text file named .npz",
        lambda t: f"dataset='npz' data-path='{text_file(t)}'",
        "notes.npz",
    ),
    (
        "data files",
        "object arrays (pickles)",
        lambda t: f"dataset='npz' data-path='{objects(t)}'",
        "objects.npz",
    ),
    (
        "data files",
        "an array missing",
        lambda t: f"dataset='npz' data-path='{digits(t, 'no_test.npz', y_test=None)}'",
        "no_test.npz",
    ),
    (
        "data files",
        "float images",
        lambda t: (
            f"dataset='npz' data-path='{digits(t, 'floats.npz', x_train=np.zeros((1000, 28, 28)))}'"
        ),
        "x_train",
    ),
    (
        "data files",
        "labels and images of different lengths",
        lambda t: (
            f"dataset='npz' data-path='{digits(t, 'short.npz', y_train=np.arange(999) % 10)}'"
        ),
        "y_train",
    ),
    (
        "data files",
        "a stray label K",
        lambda t: (
            f"dataset='npz' data-path='{stray_label(t)}' overrides='dataset.num_labeled=100 dataset.val_size=100'"
        ),
        "class 10",
    ),
    (
        "data files",
        "a test label outside the classes",
        lambda t: f"dataset='npz' data-path='{digits(t, 'test11.npz', y_test=np.full(200, 11))}'",
        "y_test",
    ),
    (
        "data files",
        "images too small for the model (2x2)",
        lambda t: (
            f"dataset='npz' data-path='"
            f"{digits(t, 'tiny.npz', x_train=np.zeros((1000, 2, 2), np.uint8), x_test=np.zeros((200, 2, 2), np.uint8))}'"
        ),
        "2x2 images",
    ),
    (
        "data files",
        "a directory for an image folder that is not there",
        lambda t: f"dataset='imagefolder' data-path='{t}/photos'",
        "photos",
    ),
    ("resume", "a directory that is not a run", lambda t: f"resume='{t}/nothing'", "nothing"),
    (
        "resume",
        "a run that failed at start-up",
        lambda t: f"resume='{never_started(t)}'",
        "ended no round",
    ),
    ("run-config", "a selection that is not key=value", "selection='0.1'", "selection"),
    (
        "resume",
        "a run whose data changed since it started",
        lambda t: f"resume='{identified(t, 'moved', data='0123456789abcdef')}'",
        "differ from those the run started with",
    ),
    (
        "resume",
        "another run's checkpoint copied in",
        lambda t: f"resume='{identified(t, 'foreign', writer='theirs')}'",
        "written by another run",
    ),
    ("resume", "a run without a checkpoint", lambda t: f"resume='{run_with(t, 'young')}'", "young"),
    (
        "resume",
        "both checkpoints truncated",
        lambda t: f"resume='{run_with(t, 'broken', 1)}'",
        "checkpoint.pt",
    ),
    (
        "resume",
        "resume with another key",
        lambda t: f"resume='{run_with(t, 'other')}' seed=3",
        "seed",
    ),
    (
        "output",
        "an output-dir that holds a finished run",
        lambda t: f"output-dir='{run_with(t, 'finished')}'",
        "holds a run",
    ),
    (
        "output",
        "an output-dir under a regular file",
        lambda t: f"output-dir='{a_file(t)}/run'",
        "afile is a file",
    ),
    ("output", "an output-dir that is a file", lambda t: f"output-dir='{a_file(t)}'", "afile"),
    (
        "output",
        "an output-dir holding the user's own files",
        lambda t: f"output-dir='{foreign_dir(t)}'",
        "not a run of this project",
    ),
    ("output", "an output-dir in /proc", "output-dir='/proc/feddb-run'", "/proc"),
    (
        "overrides",
        "more clients to wait for than a round samples",
        "overrides='fl.min_train_clients=50'",
        "fl.min_train_clients",
    ),
    ("overrides", "DPL on labels-only training", "method='fedavg' dpl=true dma=true", "dpl"),
    ("overrides", "device=cuda without a GPU", "overrides='device=cuda'", "device=cuda"),
    ("overrides", "an unknown forward mode", "overrides='train.forward=sideways'", "train.forward"),
    (
        "overrides",
        "a negative failed-round limit",
        "overrides='fl.max_failed_rounds=-1'",
        "fl.max_failed_rounds",
    ),
    ("overrides", "an evaluation batch of 0", "overrides='eval.batch_size=0'", "eval.batch_size"),
    ("overrides", "a DMA cap below 1", "overrides='dma.cap=0.5'", "dma.cap"),
    (
        "overrides",
        "a strategy whose constructor raises",
        lambda t: f"strategy='custom' overrides='strategy.target={failing_strategy(t)}:Fragile'",
        "Fragile.__init__",
    ),
    ("data files", "an npz dataset without a file", "dataset='npz'", "data-path"),
    (
        "data files",
        "a directory for an npz file",
        lambda t: f"dataset='npz' data-path='{t}'",
        "is a directory",
    ),
    (
        "data files",
        "an .npz with empty arrays",
        lambda t: (
            f"dataset='npz' data-path='"
            f"{digits(t, 'empty.npz', x_test=np.zeros((0, 28, 28), np.uint8), y_test=np.zeros(0, np.int64))}'"
        ),
        "empty.npz",
    ),
]

# other commands' arguments, as `feddb <argv>` (the temporary directory in, argv out)
ARGV_CASES = [
    ("command line", "an unknown command", lambda t: ["bogus"], "unknown command"),
    (
        "command line",
        "--run-config given twice (local)",
        lambda t: ["local", "--run-config", "seed=1", "--run-config", "seed=2"],
        "--run-config given 2 times",
    ),
    (
        "command line",
        "--run-config given twice (run)",
        lambda t: ["run", "--run-config", "seed=1", "--run-config", "seed=2"],
        "--run-config given 2 times",
    ),
    (
        "command line",
        "a GPU share without a GPU",
        lambda t: ["run", "--gpus-per-client", "0.5"],
        "--gpus-per-client",
    ),
    (
        "command line",
        "a GPU share that is no number",
        lambda t: ["run", "--gpus-per-client", "half"],
        "--gpus-per-client",
    ),
    (
        "command line",
        "no CPU for a client",
        lambda t: ["run", "--cpus-per-client", "0"],
        "--cpus-per-client",
    ),
    ("report", "a directory that is not there", lambda t: ["report", f"{t}/none"], "none"),
    ("report", "a directory without runs", lambda t: ["report", str(t)], "no finished run"),
    (
        "report",
        "runs of one row with other settings",
        lambda t: ["report", str(two_settings(t)), "--out", f"{t}/rep"],
        "differ in train.tau",
    ),
    (
        "report",
        "a seed twice under one row",
        lambda t: ["report", str(a_seed_twice(t)), "--out", f"{t}/rep"],
        "seed 0 twice",
    ),
    (
        "report",
        "--out an existing file",
        lambda t: ["report", str(run_with(t, "r")), "--out", str(a_file(t, "report.md"))],
        "report.md is a file",
    ),
    ("claims", "a root that is not there", lambda t: ["claims", f"{t}/none"], "none"),
    ("claims", "a root without runs", lambda t: ["claims", str(t)], "no complete runs"),
    (
        "claims",
        "--out an existing file",
        lambda t: ["claims", str(t), "--out", str(a_file(t, "claims.md"))],
        "claims.md is a file",
    ),
    ("reproduce", "a runs table that is not there", lambda t: ["reproduce", f"{t}/r.csv"], "r.csv"),
    (
        "reproduce",
        "a CSV that is not a runs table",
        lambda t: ["reproduce", str(a_file(t, "other.csv", "a,b\n1,2\n"))],
        "not a runs table",
    ),
    (
        "reproduce",
        "a --select field that does not exist",
        lambda t: ["reproduce", str(runs_table(t)), "--select", "colour=red"],
        "colour",
    ),
    (
        "reproduce",
        "a --select no run matches",
        lambda t: ["reproduce", str(runs_table(t)), "--select", "seed=7"],
        "seed=7",
    ),
    ("sweep", "an unknown row", lambda t: ["sweep", "-m", "row=bogus", f"out={t}/s"], "bogus"),
    ("sweep", "no jobs", lambda t: ["sweep", "--jobs", "0", "-m", "row=fedavg"], "--jobs"),
    (
        "sweep",
        "mismatch neither refuse nor beside",
        lambda t: ["sweep", "-m", "row=fedavg", f"out={t}/s", "mismatch=bogus"],
        "mismatch=bogus",
    ),
    (
        "sweep",
        "a second sweep into one out",
        lambda t: ["sweep", "-m", "row=fedavg", f"out={held_out(t)}"],
        "another sweep",
    ),
    (
        "ladder",
        "an unknown rung",
        lambda t: ["ladder", "--rungs", "tall", "--out", f"{t}/l"],
        "tall",
    ),
    ("overhead", "too few rounds to measure", lambda t: ["overhead", "--rounds", "2"], "--rounds"),
    (
        "deployment",
        "no SuperNode",
        lambda t: ["deploy", "local", "--nodes", "0", "--workdir", f"{t}/w"],
        "--nodes",
    ),
    (
        "deployment",
        "no key pair",
        lambda t: ["deploy", "keys", "--out", f"{t}/k", "--count", "0"],
        "--count",
    ),
    (
        "deployment",
        "certificates for no host",
        lambda t: ["deploy", "certs", "--out", f"{t}/c", "--hosts", " , "],
        "--hosts",
    ),
    (
        "deployment",
        "data files into a file",
        lambda t: ["deploy", "export", "--out", str(a_file(t, "export"))],
        "export is a file",
    ),
]

# `feddb deploy local`'s own options: (flags, run-config), answered before a process starts
TWO_NODES = "overrides='fl.num_clients=2 fl.fraction_train=1.0'"
DEPLOY_CASES = [
    (
        "deployment",
        "--nodes other than fl.num_clients",
        (("--nodes", "3"), TWO_NODES),
        "fl.num_clients",
    ),
    (
        "deployment",
        "--churn-every backwards",
        (("--churn", "1", "--churn-every", "90,30"), TWO_NODES),
        "--churn-every",
    ),
    (
        "deployment",
        "--churn-every not seconds",
        (("--churn", "1", "--churn-every", "often"), TWO_NODES),
        "--churn-every",
    ),
    (
        "deployment",
        "--churn-burst above --nodes",
        (("--churn", "1", "--churn-burst", "1,3"), TWO_NODES),
        "--churn-burst",
    ),
    (
        "deployment",
        "--churn-after-round without output-dir",
        (("--churn", "1", "--churn-after-round", "2"), TWO_NODES),
        "output-dir",
    ),
]


def cases() -> list[tuple]:
    """Each case for `feddb local`, the run-config ones for `feddb run` too (its preflight
    answers before Ray or a SuperLink starts), and `feddb deploy local`'s own options."""
    out = [(*c, "local") for c in CASES]
    out += [(*c, "run") for c in CASES if c[0] == "run-config"][:4]
    out += [(*c, "deploy local") for c in DEPLOY_CASES]
    out += [(*c, "argv") for c in ARGV_CASES]
    return out


def snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def answer(tmp: Path, item, command: str, capsys) -> tuple[int, str]:
    if command == "deploy local":
        from feddb.deploy import main as deploy_main

        flags, rc = item
        nodes = [] if "--nodes" in flags else ["--nodes", "2"]
        argv = ["local", *nodes, *flags, "--workdir", str(tmp / "w"), "--run-config", rc]
        before = snapshot(tmp)
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            code = deploy_main(argv)
        finally:  # deploy's main installs its own
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        err = capsys.readouterr().err.strip()
        assert snapshot(tmp) == before, "the directory changed"
        return code, err
    if command == "argv":
        from feddb.cli import main as feddb_main

        argv = item(tmp)
        SHOWN[f"{' '.join(argv[:1])}"] = argv[0] + (f" {argv[1]}" if argv[0] == "deploy" else "")
        before, saved = snapshot(tmp), list(os.sys.argv)
        try:
            code = feddb_main(argv)
        except SystemExit as stop:  # Hydra's and argparse's way out
            code = stop.code if isinstance(stop.code, int) else 1
        finally:
            os.sys.argv = saved
        err = capsys.readouterr().err.strip().splitlines()
        err = err[-1] if err else ""
        assert snapshot(tmp) == before, "the directory changed"
        return code, f"[{SHOWN[argv[0]]}] {err}"
    rc = item(tmp) if callable(item) else item
    if "resume" not in rc and "output-dir" not in rc:
        rc = f"{rc} output-dir='{tmp}/out'"
    before = snapshot(tmp)
    main = local_main if command == "local" else run_main
    code = main(["--run-config", rc])
    err = capsys.readouterr().err.strip()
    after = snapshot(tmp)
    assert after == before, f"the directory changed: {set(after) ^ set(before)}"
    return code, err


RESULTS: dict[str, str] = {}
SHOWN: dict[str, str] = {}  # the command of an argv case, for the table


@pytest.mark.parametrize(
    "area,wrong,item,word,command",
    cases(),
    ids=lambda v: "file" if callable(v) else str(v)[:40],  # stable across processes (xdist)
)
def test_a_bad_input_gets_one_line_and_exit_2_before_anything_starts(
    area, wrong, item, word, command, tmp_path, capsys
):
    code, raw = answer(tmp_path, item, command, capsys)
    err = raw.split("] ", 1)[1] if command == "argv" else raw
    assert code == 2, err
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert word in err, f"the message does not name {word!r}: {err}"
    assert "Traceback" not in err
    RESULTS[f"{area}|{wrong}|{command}"] = raw.replace(str(tmp_path), "<tmp>")


def test_the_bad_input_table_in_the_docs_is_this_tests_table(tmp_path_factory, capsys):
    rows = []
    for area, wrong, item, _, command in cases():
        key = f"{area}|{wrong}|{command}"
        if key not in RESULTS:  # run alone: answer it here
            tmp = tmp_path_factory.mktemp("case")
            code, err = answer(tmp, item, command, capsys)
            RESULTS[key] = err.replace(str(tmp), "<tmp>")
        message, shown = RESULTS[key], command
        if command == "argv":  # "[command] error: ..."
            shown, message = message[1:].split("] ", 1)
        message = re.sub(r"\s+", " ", message).replace("|", "\\|")
        rows.append(f"| {area} | {wrong} | `feddb {shown}` | 2 | {message} |")
    table = "\n".join(
        [
            f"{len(rows)} bad inputs, each answered with exit 2 before any process starts, the run "
            "directory unchanged (tests/test_bad_inputs.py):",
            "",
            "| area | input | command | exit | message |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    text = DOC.read_text()
    assert BEGIN in text and END in text, (
        f"docs/running/bad_inputs.md lost its {BEGIN} ... {END} markers"
    )
    head, rest = text.split(BEGIN)
    current, tail = rest.split(END)
    if os.environ.get("FEDDB_WRITE_DOCS") == "1":
        DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
        current = table
    current = current.strip()
    assert len(rows) >= 80
    assert current == table, (
        "docs/running/bad_inputs.md's table is stale: FEDDB_WRITE_DOCS=1 pytest " + __file__
    )

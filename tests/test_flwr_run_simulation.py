"""Real `flwr run` simulations through the project's launcher (tens of seconds each)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import flower_pids
from localgrid import metrics_without_timing
from test_scenarios import check_partial_clients_rounds

from fssl.config import group_options, interrupted_exit
from fssl.profiling import STOP_SIGNALS, Interrupted, interruptible

PROJECT = Path(__file__).resolve().parents[1]
TINY = (
    "fl.num_clients=4 fl.fraction_train=0.5 dataset.num_labeled=200 train.local_epochs=2 "
    "train.tau=0.5 fl.node_wait=120 train.warmup_rounds=0 dataset.val_size=200 model.width=8"
)
SMALL: dict[str, str] = {}  # the run-config of the suite's small dataset (1,000 training digits)


@pytest.fixture(autouse=True)
def small_data(small_npz):
    """These runs train on the suite's small `.npz`, as the deployments do: what they check is
    the launcher and Flower's path, and MNIST-10k's 8,000 digits made each run minutes longer."""
    SMALL["rc"] = f"dataset='npz' data-path='{small_npz}'"


def on_small_data(run_config: str) -> str:
    """The run-config on the small dataset, unless it names a dataset of its own."""
    return run_config if "dataset=" in run_config else f"{SMALL['rc']} {run_config}"


def launch(tmp_path, run_config, *extra, timeout=400):
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "flwr-home"))
    return subprocess.run(
        [sys.executable, "-m", "feddb.launch", "--run-config", on_small_data(run_config), *extra],
        cwd=PROJECT,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


SAME = f"num-server-rounds=2 seed=3 overrides='{TINY}'"  # the checked run's configuration


def beside(tmp_path) -> tuple[list, list]:
    """Another `feddb run` of the checked run's configuration with two SuperNodes for its four
    clients (its own Flower home, the default) and a plain `flwr run` with its own home and ports
    (docs/running.md) of FedMatch, whose per-client helper ArrayRecords go through Flower's
    serialisation and Ray, on a Flower Datasets partition (two classes per client), started at
    once: (processes, their run directories)."""
    from feddb.resources import free_port

    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    rc = on_small_data(
        "method='fedmatch' partition='pathological2' num-server-rounds=2 seed=3 "
        f"overrides='{TINY} fl.fraction_train=1.0 method.helper_interval=2'"
    )
    other, plain_out = tmp_path / "other", tmp_path / "plain"
    plain_env = dict(
        env,
        FLWR_HOME=str(tmp_path / "plain-home"),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
    )
    cmds = [
        (
            [sys.executable, "-m", "feddb.launch", "--run-config"]
            + [on_small_data(f"{SAME} output-dir='{other}'")]
            + ["--federation-config", "num-supernodes=2"],
            env,
        ),
        (
            [str(Path(sys.executable).parent / "flwr"), "run", ".", "--stream", "--run-config"]
            + [f"{rc} output-dir='{plain_out}'"],
            plain_env,
        ),
    ]
    procs = [
        subprocess.Popen(
            cmd, cwd=PROJECT, env=e, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for cmd, e in cmds
    ]
    return procs, [other, plain_out]


@pytest.mark.slow
def test_feddb_run_completes_and_writes_metrics(tmp_path):
    """... beside another `feddb run` and a plain `flwr run`, started at once: each completes in
    its own run directory (each has its own SuperLink), and none is left running."""
    out = tmp_path / "run"
    procs, dirs = beside(tmp_path)
    try:
        res = launch(tmp_path, f"{SAME} output-dir='{out}'")
        outs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for pid in flower_pids(tmp_path / "plain-home"):  # what the plain run started
            os.kill(pid, 15)
    for p, text, d in zip(procs, outs, dirs):
        assert p.returncode == 0, text[-3000:]
        # `flwr run --stream` exits 0 even when the run failed: its output says why
        assert (d / "metrics.jsonl").is_file(), text[-3000:]
        assert [json.loads(x)["round"] for x in (d / "metrics.jsonl").open()] == [1, 2]
    fedmatch = [json.loads(line) for line in (dirs[1] / "metrics.jsonl").open()]
    assert fedmatch[0]["helpers"] is None
    assert sorted(fedmatch[1]["helpers"]) == ["0", "1", "2", "3"]
    assert all(len(h) == 2 for h in fedmatch[1]["helpers"].values())
    hist = json.loads((dirs[1] / "partition_summary.json").read_text())
    assert all(sum(1 for n in h if n) == 2 for h in hist["unlabeled"])
    assert not list((PROJECT / ".flwr-home").glob(f"run-{procs[0].pid}-*"))  # its home removed
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "finished:completed" in res.stdout
    assert "[feddb] done: final test acc" in res.stdout and f"run directory: {out}" in res.stdout
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        for key in (
            "test_accuracy",
            "test_loss",
            "class_accuracy",
            "round_seconds",
            "clients",
            "dma",
            "js_divergence",
        ):
            assert key in r, key
        assert len(r["class_accuracy"]) == 10 and len(r["clients"]) == 2
        for c in r["clients"]:
            for key in (
                "partition_id",
                "num_labeled",
                "num_unlabeled",
                "app_u",
                "weight",
                "pseudo_label_accuracy",
                "pseudo_label_ratio",
            ):
                assert key in c, key
        p = np.array([c["app_u"] for c in r["clients"]])
        w = np.array([c["weight"] for c in r["clients"]])
        assert np.linalg.norm(w @ p - 0.1) <= np.linalg.norm(p.mean(0) - 0.1) + 1e-12
        assert r["dma"]["loss_weights"] <= r["dma"]["loss_uniform"]
    for name in (
        "config.yaml",
        "partition.json",
        "partition_summary.txt",
        "summary.json",
        "final_model.pt",
        "provenance.json",
    ):
        assert (out / name).is_file(), name
    # a simulation runs the method as published: no defence acts, and the run says so once
    assert res.stdout.count("a simulation runs the methods as published: the norm bound") == 1
    assert all(
        r["robust"]["clip"] is None
        and "cosines" not in r["robust"]
        and "loss_impact" not in r["robust"]
        and r["dma"]["cap"] is None
        for r in rounds
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["defence_rounds"] == {
        "clipped": 0,
        "filtered": 0,
        "loss_checked_out": 0,
        "dma_cap_bound": 0,
    }
    prov = json.loads((out / "provenance.json").read_text())
    assert len(prov["commit"]) == 40 and prov["torch"] and prov["date"].startswith("20")
    assert not flower_pids(tmp_path / "flwr-home")  # the SuperLink was stopped
    # the start-up timeline: the launcher, then the SuperLink, then the ServerApp's steps in order
    t = json.loads((out / "startup.json").read_text())
    order = [
        "launch",
        "superlink_start",
        "superexec_start",
        "process_start",
        "server_main",
        "data_ready",
        "nodes_bound",
        "first_round_sent",
        "first_round_done",
    ]
    clients = ["process_start", "client_process_start", "client_app_imported", "nodes_bound"]
    assert all(t[k] is not None for k in order + clients), t
    for chain in (order, clients):  # Ray's workers start beside the ServerApp's steps
        assert all(t[a] <= t[b] + 0.02 for a, b in zip(chain, chain[1:])), t  # /proc: 10 ms
    assert t["first_round_done"] - t["launch"] < 300
    # same seed, same machine: identical metrics from the independent simulation beside it, with
    # two SuperNodes for the four clients (each instruction names the partition to train)
    assert metrics_without_timing(dirs[0]) == metrics_without_timing(out)


def _ray_head_of(launcher_pid: int) -> int | None:
    """The pid (= process group) of the `ray start --head` the launcher started, if any."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher_pid and b"start" in cmd and any(c.endswith(b"/ray") for c in cmd):
            return int(proc.name)
    return None


PARTITION_0_FAILS = """
from fssl.methods.fixmatch import FixMatch

FAIL = {fail}  # partition 0's client seeds (fssl.train.client_seed), round by round


class PartitionZeroFails(FixMatch):
    def fit(self, model, data, instruction, *args, **kwargs):
        if instruction.seed in FAIL:
            raise RuntimeError("partition 0 fails")
        return super().fit(model, data, instruction, *args, **kwargs)
"""


@pytest.mark.slow
def test_a_run_with_skipped_rounds_exits_4_and_says_how_many_last(tmp_path):
    """Through Flower: partition 0 of 3 fails every round and fl.min_train_clients=3, so each
    round keeps the global model; Flower ends the run `finished:completed`, and the launcher
    (which reads the ServerApp's line in the log) names the skipped rounds last and exits 4."""
    from fssl.train import client_seed

    method = tmp_path / "zero_fails.py"
    method.write_text(PARTITION_0_FAILS.format(fail={client_seed(5, r, 0) for r in (1, 2)}))
    out = tmp_path / "run"
    overrides = (
        "fl.num_clients=3 fl.fraction_train=1.0 fl.min_train_clients=3 dataset.num_labeled=150 "
        "train.local_epochs=1 fl.node_wait=120 train.warmup_rounds=0 model.width=8"
    )
    res = launch(
        tmp_path,
        f"method='{method}:PartitionZeroFails' num-server-rounds=2 seed=5 output-dir='{out}' "
        f"overrides='{overrides}'",
    )
    assert res.returncode == 4, res.stdout[-3000:] + res.stderr[-3000:]
    assert (
        res.stdout.strip()
        .splitlines()[-1]
        .endswith(
            "finished:completed; 2 of 2 rounds skipped (round 1, 2: fewer valid replies than "
            "fl.min_train_clients, the global model kept)"
        )
    )
    assert json.loads((out / "summary.json").read_text())["skipped_rounds"] == [1, 2]


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_each_stop_signal_unwinds_once_with_its_exit_status(signum):
    """SIGINT (Ctrl-C), SIGTERM (a sweep or a job system) and SIGHUP (a closed terminal) take one
    path: the launcher's `interruptible` turns the first into Interrupted (a KeyboardInterrupt,
    so every `finally` on the way out runs), ignores a second, gives the old handlers back, and
    the exit status is 128 + the signal. The Flower run below stops with one of them."""
    before, caught = signal.getsignal(signum), None
    with interruptible():
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises before this ends
        except Interrupted as err:
            caught = err
        os.kill(os.getpid(), signum)  # a second one is ignored: the clean-up is not cut short
    assert caught is not None and caught.code == 128 + signum
    assert interrupted_exit(caught, None, ["feddb", "run"]) == 128 + signum
    assert signal.getsignal(signum) == before


@pytest.mark.slow
def test_a_stopped_launcher_leaves_no_superlink_and_no_ray_head(tmp_path):
    """SIGHUP (a closed terminal: it used to leave the Ray head, its raylet and GCS, the
    SuperLink and the SuperExec running) unwinds the launcher: what it started goes, and its
    last line, no traceback, says how to resume; the exit status is 128 + the signal. (SIGINT and
    SIGTERM take the same path: the test above.)"""
    from feddb.resources import group_alive

    signum = "SIGHUP"

    env = dict(os.environ, FLWR_HOME=str(tmp_path / "flwr-home"))
    run = tmp_path / "run"
    rc = f"num-server-rounds=50 output-dir='{run}' overrides='{TINY} checkpoint.every=1'"
    proc = subprocess.Popen(
        [sys.executable, "-m", "feddb.launch", "--run-config", on_small_data(rc)],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    head = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (
        head and flower_pids(tmp_path / "flwr-home") and (run / "checkpoint.pt").exists()
    ):
        head = head or _ray_head_of(proc.pid)
        time.sleep(0.2)
    assert head and flower_pids(tmp_path / "flwr-home"), "the run did not start"
    sig = getattr(signal, signum)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert not flower_pids(tmp_path / "flwr-home")
    assert not group_alive(head)
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"interrupted; resume with: feddb run --run-config \"resume='{run}'\""
    )


@pytest.mark.parametrize(
    "run_config,message",
    [
        (
            "method='fedbogus'",
            "unknown method 'fedbogus': choose one of " + ", ".join(group_options("method")),
        ),
        ("dataset='imagenet'", "unknown dataset 'imagenet'"),
        (
            "dataset='cifar10' data-path='/nonexistent/cifar'",
            "cifar10 not found in /nonexistent/cifar",
        ),
        ("overrides='train.tau=1.5'", "`train.tau`: 1.5; allowed: a number with 0 < tau <= 1"),
        ("overrides='partition.delta=0'", "`partition.delta`: 0; allowed: a number > 0"),
        ("bogus-key=1", "unknown run-config key(s) ['bogus-key']"),
        (
            "scenario='labels_at_server' overrides='fl.fraction_evaluate=0.2'",
            "in scenario labels_at_server",
        ),
    ],
)
def test_bad_input_stops_before_anything_starts(tmp_path, run_config, message, monkeypatch, capsys):
    """The launcher's own `main`, here (its process's exit code is main's: the failed-run test)."""

    from feddb.launch import main

    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the launcher's signal handlers
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    monkeypatch.setenv("FEDDB_LAUNCH_TIME", "0")  # main sets it: restored afterwards
    assert main(["--run-config", on_small_data(run_config)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "flwr-home").exists()  # no SuperLink, no run


def test_flower_without_its_bin_on_path_is_told_what_to_put_there(tmp_path, monkeypatch, capsys):
    """Flower starts its local SuperLink by name, from PATH: with the `flwr` of an environment
    whose bin is not on PATH, the launcher says which directory to put there and exits 2."""
    from feddb.launch import flwr_run

    bin_dir = tmp_path / "bin"  # the launcher's interpreter and `flwr`, without flower-superlink
    bin_dir.mkdir()
    (bin_dir / "flwr").symlink_to(Path(sys.executable).with_name("flwr"))
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    assert flwr_run(PROJECT, {"num-supernodes": 1}, show=False) == 2
    assert capsys.readouterr().err == (
        f"error: no `flower-superlink` on PATH: put {bin_dir} (the bin of Flower's environment) "
        "on it\n"
    )


def plain_flwr_run(tmp_path, name: str, run_config: str) -> subprocess.Popen:
    """A plain `flwr run` (docs/running.md) in its own Flower home and on its own ports."""
    from feddb.resources import free_port

    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    env |= {
        "FLWR_HOME": str(tmp_path / f"{name}-home"),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
    }
    cmd = [str(Path(sys.executable).parent / "flwr"), "run", ".", "--stream", "--run-config"]
    return subprocess.Popen(
        [*cmd, on_small_data(run_config)],
        cwd=PROJECT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_the_partial_clients_methods_run_through_flwr_run(tmp_path):
    """RSCFed and CBAFed through a plain `flwr run` each (Ray, the labels at two of four clients),
    started at once: each shows its own rounds (tests/test_scenarios.py)."""
    common = (
        "scenario='labels_at_partial_clients' num-server-rounds=2 seed=3 "
        f"overrides='{TINY} fl.fraction_train=1.0 train.warmup_rounds=1'"
    )
    methods = ("rscfed", "cbafed")
    procs = [
        plain_flwr_run(tmp_path, m, f"method='{m}' {common} output-dir='{tmp_path / m}'")
        for m in methods
    ]
    try:
        outs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for m in methods:
            for pid in flower_pids(tmp_path / f"{m}-home"):
                os.kill(pid, 15)
    for m, p, text in zip(methods, procs, outs):
        assert p.returncode == 0 and (tmp_path / m / "summary.json").is_file(), text[-3000:]
        rounds = [json.loads(x) for x in (tmp_path / m / "metrics.jsonl").open()]
        check_partial_clients_rounds(m, rounds)

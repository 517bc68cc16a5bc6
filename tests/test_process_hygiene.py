"""The suite's own check that a test leaves no process behind can fail."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import children_left, set_child_subreaper


def test_a_grandchild_orphaned_by_its_parent_is_found_and_stopped():
    set_child_subreaper(True)
    try:
        # the child starts a sleeper in a session of its own and exits at once: an orphan
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import subprocess; subprocess.Popen(['sleep', '60'], start_new_session=True)",
            ],
            check=True,
        )
    finally:
        set_child_subreaper(False)
    assert children_left(grace=0.5) == ["sleep 60"]
    assert children_left(grace=0.0) == []


def test_a_deployment_stops_what_a_node_that_exited_early_left_behind(
    tmp_path, no_process_left_behind
):
    """A SuperNode refused by the SuperLink exits at once; the SuperExec it had started lives on
    unless `close` stops it (a CI run found one, 2026-11-27): here a 'node' that starts a
    sleeper and exits, before the deployment is closed."""
    from feddb.deploy import LocalDeployment

    dep = LocalDeployment(tmp_path, insecure=True)
    node = dep._start(
        "node", [sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '60'])"]
    )
    assert node.wait(timeout=30) == 0
    dep.close()


def test_a_crashed_supernode_takes_what_it_started_with_it(tmp_path, no_process_left_behind):
    """A machine that crashes takes all its processes: the churn's kill of a SuperNode ends its
    SuperExec, ClientApp processes and resident worker too, even one in a session of its own
    (the resident worker's), where a node killed alone left them running for minutes."""
    from client_app.resident import alive
    from feddb.deploy import LocalDeployment

    dep = LocalDeployment(tmp_path, insecure=True)
    spawn = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "print(p.pid, flush=True); time.sleep(60)"
    )
    node = subprocess.Popen(
        [sys.executable, "-c", spawn],
        env={**dep.env, "FLWR_HOME": str(tmp_path / "home-supernode_0")},
        stdout=subprocess.PIPE,
        text=True,
    )
    dep.procs["supernode_0"] = node
    orphan = int(node.stdout.readline())
    dep.crash("supernode_0")
    deadline = time.monotonic() + 10
    while alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert node.returncode == -signal.SIGKILL and not alive(orphan)
    dep.close()


def test_the_churn_readmits_a_refused_node_but_not_one_it_holds_down(tmp_path):
    """A restarted node the SuperLink refused is started again RETRY s after it exited; a node
    the churn killed (again) is not, until its down time is over: one process per node (a
    readmission during the down time once left two nodes holding one partition)."""
    from feddb.deploy import Churn

    class Dep:
        def __init__(self):
            self.procs, self.started = {}, []

        def start_supernode(self, i, *args, **kwargs):
            self.started.append(i)
            self.procs[f"supernode_{i}"] = subprocess.Popen(["true"])
            self.procs[f"supernode_{i}"].wait()  # refused at once

    dep = Dep()
    churn = Churn(dep, 2, [None, None], [], 0, tmp_path / "churn.jsonl")
    churn.RETRY = 0.0
    churn.t0 = time.monotonic()
    churn.start_node(0)
    churn.start_node(1)
    churn.down.add(1)  # killed again while refused
    churn.readmit()
    churn.readmit()
    assert dep.started == [0, 1, 0, 0]  # 0 again at each look (RETRY 0 here), 1 not while down
    churn.down.discard(1)
    churn.readmit()
    assert dep.started[-2:] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_deployment_with_churn_running_stops_everything_it_started(
    tmp_path, no_process_left_behind, small_npz, signum
):
    """`feddb deploy local` sent SIGTERM (a batch system's stop) or SIGHUP (a closed terminal)
    unwinds as Ctrl-C does: the churn thread is stopped first, so no node is
    started again behind `close`, then every node and what Flower started for them end. Sent
    once a node has been killed by the churn and is due back."""
    from conftest import flower_pids

    workdir = tmp_path / "w"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "feddb.deploy",
            "local",
            "--nodes",
            "2",
            "--insecure",
            "--workdir",
            str(workdir),
            "--churn",
            "0",
            "--churn-every",
            "1,1",
            "--churn-down",
            "3,3",
            "--run-config",
            f"dataset='npz' data-path='{small_npz}' num-server-rounds=50 "
            "overrides='fl.num_clients=2 fl.fraction_train=1.0 model.width=8 dataset.num_labeled=150 dataset.val_size=200'",
        ],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    churn = workdir / "churn.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if churn.is_file() and '"kill"' in churn.read_text():
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 128 + signum, out[-3000:]
    assert "interrupted" in out, out[-3000:]
    assert not flower_pids(workdir)


def test_feddb_local_sent_sighup_says_how_to_resume_and_exits_129(tmp_path, small_npz):
    """`feddb local` stopped by a closed terminal's SIGHUP once it has a checkpoint: no
    traceback, one line with the command that resumes it, exit 128 + SIGHUP."""
    run = tmp_path / "run"
    rc = (
        f"dataset='npz' data-path='{small_npz}' num-server-rounds=50 output-dir='{run}' "
        "overrides='fl.num_clients=3 fl.fraction_train=1.0 dataset.num_labeled=100 "
        "model.width=8 checkpoint.every=1'"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "feddb.inprocess", "--run-config", rc],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (run / "checkpoint.pt").exists():
        time.sleep(0.1)
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"interrupted; resume with: feddb local --run-config \"resume='{run}'\""
    )

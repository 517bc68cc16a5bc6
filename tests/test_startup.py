"""The start-up timeline (fssl/profiling.py) and `feddb startup`'s table."""

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import feddb.launch as launch
from fssl.profiling import Timeline, process_start


def test_process_start_is_this_process_start():
    started = process_start()
    assert started is not None and started <= time.time()
    assert time.time() - started < 3600  # this test's own process, not the boot
    assert process_start(10**9) is None  # no such process


def test_ancestor_start_finds_the_named_parent_process():
    marker = "feddb_marker_parent_xyz"
    child = (
        "import json, sys; from fssl.profiling import ancestor_start, process_start; "
        "print(json.dumps([ancestor_start(sys.argv[1]), ancestor_start('no-such-' + 'name-q')]))"
    )
    parent = (
        f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', "
        f"{child!r}, {marker!r}]))"
    )
    before = time.time()
    res = subprocess.run(
        [sys.executable, "-c", parent, marker], capture_output=True, text=True, check=True
    )
    found, missing = json.loads(res.stdout)
    assert missing is None
    assert before - 0.05 <= found <= time.time()  # the parent started in this window


def test_timeline_marks_in_order_and_writes_once(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDDB_LAUNCH_TIME", "123.5")
    t = Timeline()
    assert t.marks["launch"] == 123.5 and t.marks["superlink_start"] is None  # no SuperLink here
    t.mark("data_ready")
    t.write(tmp_path / "startup.json")
    t.mark("later")
    t.write(tmp_path / "startup.json")
    saved = json.loads((tmp_path / "startup.json").read_text())
    assert "later" not in saved and saved["server_main"] <= saved["data_ready"]
    assert saved["process_start"] <= saved["server_main"]


def test_startup_table_gives_medians_since_the_launcher_and_the_superlink(monkeypatch, capsys):
    import benchmarks.startup as st

    counter = iter(range(10))

    def fake(out, home, rc, launcher_args=()):
        i = next(counter)
        return {
            "launch": 100.0,
            "superlink_start": 102.0,
            "process_start": 105.0,
            "server_main": 108.0,
            "data_ready": 109.0,
            "nodes_bound": 112.0 + i,
            "first_round_sent": 112.6 + i,
            "first_round_done": 114.0 + i,
        }

    monkeypatch.setattr(st, "one_run", fake)
    assert st.main(["--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert (
        "| round 1 aggregated, evaluated and recorded | 15.0 (14.0-16.0) | 13.0 (12.0-14.0) |"
        in out
    )
    assert "| SuperLink process started (by `flwr run`) | 2.0 (2.0-2.0) | 0.0 (0.0-0.0) |" in out
    assert st.main(["--repeat", "0"]) == 2


def test_the_lean_app_copy_builds_the_same_fab_without_walking_the_venv(tmp_path):
    """`flwr run` is pointed at a copy without .venv, runs/ and the like: same FAB, byte for byte."""
    from pathlib import Path

    from flwr.cli.build import build_fab_from_disk

    from feddb.launch import PROJECT, lean_app

    (PROJECT / "runs").mkdir(exist_ok=True)  # ignored output: must not reach the copy
    stage = lean_app(PROJECT, tmp_path / "stage")
    copied = {p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()}
    assert "pyproject.toml" in copied and "strategy/base.py" in copied
    assert not any(p.split("/")[0] in (".venv", ".git", "runs", ".flwr-home") for p in copied)
    assert build_fab_from_disk(stage) == build_fab_from_disk(Path(PROJECT))


_DRIVER = (
    "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR');"
    " print(int(ray.cluster_resources()['CPU']), flush=True); sys.stdin.read()"
)


def _why(stderr: str) -> str:
    """The lines of a failed driver's stderr that say why (not its native stack)."""
    return "\n".join(l for l in stderr.splitlines() if "rror" in l or "failed" in l)[-2000:]


def test_two_ray_heads_side_by_side_serve_their_drivers_and_are_stopped_whole(tmp_path):
    """Two runs at once: two heads, a driver for each started together (before the heads let the
    OS pick worker ports, both handed out 10002 and one driver failed in about half the tries)."""
    import threading
    import time

    from feddb.resources import group_alive, ray_head

    with ray_head(True) as first, ray_head(True) as second:
        # polled as the launcher polls it: the head's start-up yield ends (at nice 15 for the
        # whole test, it came up too late for the driver beside another test's runs)
        done = threading.Event()

        def poll():
            while not done.is_set():
                first.watch(), second.watch()
                time.sleep(0.2)

        threading.Thread(target=poll, daemon=True).start()
        drivers = [  # started at once, as two launchers' simulations are
            subprocess.Popen(
                [sys.executable, "-c", _DRIVER, head.address],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for head in (first, second)
        ]
        for driver in drivers:  # each connected (all CPUs, as ray.init's) while the other is
            cpus = driver.stdout.readline()
            assert cpus.strip() == str(os.cpu_count()), _why(driver.communicate(timeout=60)[1])
        for driver in drivers:
            _, err = driver.communicate("", timeout=60)
            assert driver.returncode == 0, _why(err)
        done.set()
        assert first.failure() is None and second.failure() is None
        stopped = [(head.proc.pid, head.temp) for head in (first, second)]
    assert not any(group_alive(pgid) or temp.exists() for pgid, temp in stopped)
    with ray_head(False) as none:
        assert none is None


def _fake(tmp_path, name, body):
    exe = tmp_path / name
    exe.write_text(f"#!{sys.executable}\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def test_a_ray_head_that_fails_is_reported_and_the_launcher_falls_back(
    tmp_path, monkeypatch, capsys
):
    import feddb.resources as resources

    monkeypatch.setattr(
        resources,
        "ray_exe",
        lambda: _fake(
            tmp_path, "ray", "import sys; print('ValueError: no such port'); sys.exit(3)"
        ),
    )
    with resources.ray_head(True) as head:
        head.proc.wait(timeout=30)
        assert "exited (code 3)" in head.failure() and "no such port" in head.failure()
    seen = {}

    def fake_flwr_run(app, fed, rc, env, verbose, watch=None):
        seen.update(env=env, watch=watch)
        return 0

    monkeypatch.setattr(launch, "flwr_run", fake_flwr_run)
    real_head = launch.ray_head

    @contextlib.contextmanager
    def failed_head(enabled):  # the head as the launcher finds it once it has failed
        with real_head(enabled) as head:
            head.proc.wait(timeout=30)
            yield head

    monkeypatch.setattr(launch, "ray_head", failed_head)
    assert launch.main(["--run-config", "num-server-rounds=1"]) == 0
    out = capsys.readouterr().out
    assert "no such port" in out and "starts Ray itself instead" in out
    assert "RAY_ADDRESS" not in seen["env"] and seen["watch"] is None


def test_the_watchdog_stops_the_run_when_what_it_watches_fails(tmp_path, capsys):
    import threading

    from feddb.launch import superlink_pids, watchdog

    port = 45678
    link = subprocess.Popen(
        [_fake(tmp_path, "flower-superlink", "import time; time.sleep(120)"), "--port", str(port)]
    )
    for _ in range(50):
        if superlink_pids(port):
            break
        time.sleep(0.1)
    assert superlink_pids(port) == [link.pid]
    state = iter([None, None, "the Ray head started for this run exited (code 1)"])
    watchdog(lambda: next(state), threading.Event(), port, [])
    assert link.wait(timeout=30) != 0  # stopped by the watchdog
    err = capsys.readouterr().err
    assert "exited (code 1)" in err and "--flower-ray" in err


def _session(argv0: str) -> subprocess.Popen:
    """A process leading a session of its own, named argv0 (as Ray names its workers), returned
    once bash has exec'd it under that name."""
    proc = subprocess.Popen(["bash", "-c", f"exec -a '{argv0}' sleep 30"], start_new_session=True)
    for _ in range(200):
        if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(argv0.encode()):
            break
        time.sleep(0.01)
    return proc


def test_the_ray_head_yields_the_cpu_until_its_first_worker_starts(tmp_path):
    """Autogroup: the head's session gets Ray's worker niceness while the run starts, and an equal
    share once a `ray::` worker runs in it (its raylet relays every reply)."""
    from pathlib import Path

    from feddb.resources import RayHead, workers_started

    starting, running = _session("raylet"), _session("ray::ClientAppActor.run")
    try:
        ours = (
            Path("/proc/self/autogroup").read_text()
            if Path("/proc/self/autogroup").exists()
            else None
        )
        heads = [RayHead(p, "127.0.0.1:1", tmp_path) for p in (starting, running)]
        if ours is None:  # no autogroup: nothing to change
            assert not heads[0].yielding and heads[0].watch() is None
            return
        nice = lambda p: Path(f"/proc/{p.pid}/autogroup").read_text().split()[-1]  # noqa: E731
        assert all(h.yielding for h in heads) and nice(starting) == nice(running) == "15"
        assert not workers_started(starting.pid) and workers_started(running.pid)
        assert [h.watch() for h in heads] == [None, None]  # both alive: no failure
        assert heads[0].yielding and nice(starting) == "15"  # no worker yet: still yielding
        assert not heads[1].yielding and nice(running) == "0"
        assert Path("/proc/self/autogroup").read_text() == ours  # ours untouched
    finally:
        for p in (starting, running):
            p.kill()
            p.wait()


def test_a_zombie_is_not_alive_and_the_proc_walk_leaves_it_out():
    """A child that exited but is not yet reaped: stop() must not wait its grace for it."""
    from fssl.profiling import alive, live_processes

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(100):  # exited, not reaped: a zombie
        if not alive(child.pid):
            break
        time.sleep(0.05)
    assert not alive(child.pid)
    assert child.pid not in {pid for pid, _ in live_processes()}
    assert alive(os.getpid()) and os.getpid() in {pid for pid, _ in live_processes()}
    child.wait()


LATE = (
    '{"success": false, "error-message": "Starting local SuperLink on 127.0.0.1:47119...\\n\\n'
    'Failed to start local SuperLink within 15s. See logs at /x/superlink.log."}'
)
STARTED_RUN = '{"success": true, "run-id": 7}'


@pytest.mark.parametrize(
    "replies, calls, run_started",
    [
        ([LATE, STARTED_RUN], 2, True),  # Flower's SuperLink was late once: a fresh one is started
        ([LATE, LATE, LATE, STARTED_RUN], 3, False),  # late every time: the third answer stands
        (['{"success": false, "error-message": "bad FAB"}', STARTED_RUN], 1, False),  # no retry
    ],
)
def test_a_superlink_late_for_flowers_15_s_is_started_again(
    monkeypatch, replies, calls, run_started
):
    made = []

    def fake_flwr(args, env, capture=False):
        made.append(args)
        return subprocess.CompletedProcess(args, 1, stdout=replies[len(made) - 1], stderr="")

    monkeypatch.setattr(launch, "flwr", fake_flwr)
    started = launch.start_run(["run", "app"], {})
    assert len(made) == calls and all(a == ["run", "app"] for a in made)
    assert ('"run-id"' in started.stdout) == run_started


def test_a_run_that_failed_while_training_makes_the_launcher_exit_3(tmp_path, monkeypatch, capsys):
    """`feddb run`: the ServerApp's "run failed" line in the run's log makes the launcher exit 3
    with that cause in one line, and what Flower prints after it (the ServerApp's traceback) is
    not shown."""
    log = (
        "INFO :      [feddb] round   3/9  test acc 0.1410\n"
        "INFO :      [feddb] run failed: round 1 trained no client (all 2 sampled failed; "
        "partition 1, node 5: client error: RuntimeError: boom)\n"
        "ERROR :     Traceback (most recent call last):\n"
        "ERROR :     RunFailed: round 1 trained no client\n"
    )
    fake = _fake(tmp_path, "flwr", f"import sys; sys.stdout.write({log!r})")
    monkeypatch.setattr(launch, "flwr_exe", lambda: fake)
    monkeypatch.setattr(launch, "lean_app", lambda app, stage: app)
    monkeypatch.setattr(
        launch,
        "start_run",
        lambda cmd, env: subprocess.CompletedProcess(cmd, 0, stdout='{"run-id": 7}', stderr=""),
    )
    monkeypatch.setattr(launch, "wait_for", lambda *a, **k: {"status": "finished:failed"})
    monkeypatch.setattr(launch, "stop_run", lambda *a: None)
    monkeypatch.setattr(launch, "FAILED", [])
    assert launch.flwr_run(tmp_path, {}, "") == 3
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err.strip() == (
        "error: run failed: round 1 trained no client (all 2 sampled failed; partition 1, node 5: "
        "client error: RuntimeError: boom)"
    )

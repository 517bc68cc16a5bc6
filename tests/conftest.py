"""Shared helpers: a tiny resolved configuration and hand-built Flower messages."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,  # noqa: E402
    MetricRecord,
    RecordDict,
)

from feddb.inprocess import make_metadata  # noqa: E402,F401
from server_app.config import compose  # noqa: E402

TINY = [
    "fl.num_clients=4",
    "fl.fraction_train=0.5",
    "num_rounds=2",
    "dataset.num_labeled=200",
    "train.local_epochs=2",
    "train.tau=0.5",
]


@pytest.fixture(scope="session")
def tiny_cfg() -> dict:
    return compose(TINY)


def patch_task_identity(mp: pytest.MonkeyPatch) -> None:
    """Flower's Message() needs a task identity, which only its runtime sets."""
    from flwr.supercore.task_identity import TaskIdentity

    for key, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", "t")):
        mp.setattr(TaskIdentity, key, value, raising=False)


@pytest.fixture(autouse=True)
def _clients_work_in_the_tests_process(request, monkeypatch):
    """A ClientApp called directly in a test with a node's own data does the work here: a
    resident worker's parent would be the test runner's, which outlives the test
    (tests/test_resident_worker.py starts its workers under a parent it stops)."""
    if "resident" not in request.keywords:
        monkeypatch.setattr("client_app.resident.enabled", lambda context: False)


@pytest.fixture
def task_identity(monkeypatch):
    patch_task_identity(monkeypatch)


@pytest.fixture(scope="session")
def small_npz(tmp_path_factory):
    """1,200 MNIST digits as a `.npz`, so that each simulated round takes a fraction of a second."""
    from fssl.data import embedded_candidates

    src = np.load(next(p for p in embedded_candidates() if p.is_file()))
    path = tmp_path_factory.mktemp("data") / "small.npz"
    np.savez(
        path,
        x_train=src["x_train"][:1000],
        y_train=src["y_train"][:1000],
        x_test=src["x_test"][:200],
        y_test=src["y_test"][:200],
    )
    return path


def flower_pids(marker: Path) -> list[int]:
    """Running flower-superlink/-supernode/-superexec processes whose command line names `marker`
    (a test's FLWR_HOME or deployment directory): what a test must have stopped."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if proc.name.isdigit() and b"flower-super" in cmd and str(marker).encode() in cmd:
            pids.append(int(proc.name))
    return pids


PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def set_child_subreaper(on: bool) -> None:
    """While on, a process orphaned below this one is re-parented here, not to init: what a test
    started and left behind stays findable."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def reap_children() -> list[int]:
    """Reap this process's exited children; the pids of those still running."""
    from fssl.profiling import live_processes

    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return [pid for pid, f in live_processes() if int(f[1]) == os.getpid()]


def children_left(grace: float) -> list[str]:
    """Reap this process's exited children, waiting up to `grace` s for the live ones to end;
    the command lines of those still running (then killed, so that the next test starts clean)."""
    from fssl.profiling import cmdline

    deadline = time.monotonic() + grace
    while (pids := reap_children()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [b" ".join(filter(None, cmdline(pid)[:3])).decode(errors="replace") for pid in pids]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:  # a killed child dies a moment later (sooner on an idle machine): reap it
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    reap_children()
    return left


@pytest.fixture
def no_process_left_behind():
    """Fails the test if any process it started (or one of theirs) outlives it by 10 s."""
    set_child_subreaper(True)
    try:
        yield
    finally:
        set_child_subreaper(False)
    assert not children_left(grace=10.0)


def make_instruction(
    arrays: ArrayRecord, config: ConfigRecord, mtype: str = MessageType.TRAIN
) -> Message:
    return Message(
        content=RecordDict({"arrays": arrays, "config": config}), metadata=make_metadata(mtype)
    )


def make_context(pid: int = 0, n: int = 4) -> Context:
    return Context(
        run_id=1,
        node_id=123,
        node_config={"partition-id": pid, "num-partitions": n},
        state=RecordDict(),
        run_config={},
    )


def make_reply(arrays: dict[str, np.ndarray], metrics: dict, node: int) -> Message:
    """A train reply as a client would send it, from `node`."""
    instruction = Message(content=RecordDict(), metadata=make_metadata(src=0, dst=node))
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "metrics": MetricRecord(metrics),
        }
    )
    return Message(content=content, reply_to=instruction)


def pytest_collection_modifyitems(items):
    """The real Flower runs (`slow`, a minute or two each) first: xdist's worksteal gives the first
    process the front of the list, so it runs them one after another while the other takes the
    short tests, and neither ends waiting on the last deployment. (Two at once was slower in a
    clean-clone run, 920 s against 893 s, and a plain `flwr run`'s local SuperLink then missed
    Flower's 15 s start-up limit. A third process was no faster on the 2-core Xeon, 16 min 57 s
    against 17 min 11 s, a SuperLink restart's test taking 240 s instead of 80. xdist_group cannot
    pin them: under pytest 9 the group xdist appends to a test's id is lost.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-durations",
        type=int,
        metavar="N",
        help="list the N tests that took the most CPU time, every process they started included "
        "(those orphaned are re-parented to the test's process so that their time is counted)",
    )


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.config.getoption("--cpu-durations") is not None:
        set_child_subreaper(True)
        item.stash[_CPU_START] = _cpu_seconds()
    yield


_CPU_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _CPU_START in item.stash:
        reap_children()  # what ended, so that its CPU time is counted
        spent = _cpu_seconds() - item.stash[_CPU_START]
        outcome.get_result().user_properties.append(("cpu_s", spent))


_CPU_SPENT: dict[str, float] = {}


def pytest_runtest_logreport(report):
    for key, value in report.user_properties:
        if key == "cpu_s" and report.when == "teardown":
            _CPU_SPENT[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, config):
    n = config.getoption("--cpu-durations")
    if n is None or not _CPU_SPENT:
        return
    total = sum(_CPU_SPENT.values())
    terminalreporter.section(f"CPU time: {total:.0f} s in all; the {n} largest")
    for nodeid, spent in sorted(_CPU_SPENT.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{spent:8.1f}s  {nodeid}")

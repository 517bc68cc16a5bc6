"""Shared helpers: a tiny resolved configuration and hand-built Flower messages."""

from __future__ import annotations

import sys
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

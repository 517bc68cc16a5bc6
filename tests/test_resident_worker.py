"""A deployed node's resident worker (client_app/resident.py): the ClientApp relays each message to
it, and its reply is the one the ClientApp would have made itself."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY
from test_client_app import _run

from client_app import resident
from server_app.config import compose

pytestmark = pytest.mark.resident  # conftest: the ClientApp's relay stays on here


def small(small_npz) -> list[str]:
    """TINY on 1,000 digits, one epoch: a message takes a fraction of a second."""
    return TINY + [f"dataset.path={small_npz}", "dataset.val_size=100", "train.local_epochs=1"]


@pytest.fixture
def node(tmp_path, monkeypatch, small_npz):
    """A node's data file, a short runtime directory (a Unix socket's path has 107 bytes at most)
    and a stand-in for the SuperNode's executor: the workers' parent, stopped at the end."""
    from fssl.data import write_client_files
    from fssl.runtime import dataset_for, partition_for

    cfg = compose(small(small_npz))
    part = partition_for(cfg)
    files = write_client_files(dataset_for(cfg), part.labeled, part.unlabeled, tmp_path)
    runtime = tempfile.mkdtemp(prefix="r")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    monkeypatch.setattr(resident.os, "getppid", lambda: parent.pid)
    yield cfg, files, parent
    parent.kill()
    parent.wait()
    sockets = list(Path(runtime).rglob("*.sock"))
    deadline = time.monotonic() + 10
    while any(s.exists() for s in sockets) and time.monotonic() < deadline:
        time.sleep(0.1)  # each worker sees its parent gone within a second
    assert not any(s.exists() for s in sockets), "a resident worker outlived its parent"
    assert not list(Path(runtime).rglob("*.lock"))  # nothing left behind but a log with text


def without_timing(metrics) -> dict:
    return {k: v for k, v in metrics.items() if not k.endswith("_seconds")}


def test_the_workers_reply_and_kept_state_are_the_clientapps_own(node, monkeypatch):
    cfg, files, _ = node
    own = {"data-path": str(files[2])}
    _, relayed = _run(cfg, pid=2, node_config=own)
    path = next(Path(os.environ["XDG_RUNTIME_DIR"]).rglob("*.sock"))
    assert path.exists() and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    _, direct = _run(cfg, pid=2, node_config={**own, "resident": "false"})
    a, b = (r.content["arrays"].to_torch_state_dict() for r in (relayed, direct))
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert without_timing(relayed.content["metrics"]) == without_timing(direct.content["metrics"])

    # the second message reuses the worker; what the method keeps comes back in context.state
    monkeypatch.setattr(resident, "start", lambda *a: pytest.fail("a second worker was started"))
    from conftest import make_context, make_instruction
    from flwr.app import ArrayRecord, ConfigRecord
    from test_client_app import with_meta

    from client_app.app import app as client_app
    from fssl.methods import make_model

    full = with_meta({**cfg, "method": compose(TINY + ["method=flexmatch"])["method"]})
    model = make_model(full, 10, 1)
    import json

    config = ConfigRecord({"server-round": 1, "lr": 0.1, "client-config": json.dumps(full)})
    ctx = make_context(2)
    ctx.node_config.update(own)
    reply = client_app(make_instruction(ArrayRecord(model.state_dict()), config), ctx)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert any(key.endswith("-2") for key in ctx.state.array_records)  # FlexMatch's counts


def test_the_query_starts_the_worker_and_round_1_waits_for_that_one(node, monkeypatch):
    """The node-binding query starts the worker without waiting for it; the first train message,
    arriving while it still starts, connects to that worker instead of starting a second."""
    from conftest import make_context

    from client_app.app import app as client_app

    cfg, files, parent = node
    ctx = make_context(2)
    ctx.node_config["data-path"] = str(files[2])
    spawned = []
    real_spawn = resident.spawn
    monkeypatch.setattr(resident, "spawn", lambda *a: spawned.append(real_spawn(*a)) or spawned[-1])
    from flwr.app import Message, MessageType, RecordDict

    from feddb.inprocess import make_metadata

    query = Message(RecordDict(), metadata=make_metadata(MessageType.QUERY))
    t0 = time.monotonic()
    reply = client_app(query, ctx)
    assert not reply.has_error() and time.monotonic() - t0 < 2.0  # not waiting for the imports
    assert len(spawned) == 1
    resident.prestart(ctx)  # a second query: the worker is starting, none other is started
    _, relayed = _run(cfg, pid=2, node_config={"data-path": str(files[2])})
    assert not relayed.has_error() and len(spawned) == 1


def test_an_error_in_the_worker_is_the_clientapps_error(node):
    """A node with its own data refuses another partition: raised in the worker, it comes back
    as the ClientApp's error reply, with the worker's traceback in it."""
    import json

    from conftest import make_context, make_instruction
    from flwr.app import ArrayRecord, ConfigRecord
    from test_client_app import with_meta

    from fssl.methods import make_model
    from strategy import contract

    cfg, files, _ = node
    full = with_meta(cfg)
    ctx = make_context(2)
    ctx.node_config["data-path"] = str(files[2])
    config = ConfigRecord(
        {"server-round": 1, "lr": 0.1, "client-config": json.dumps(full), contract.PARTITION: 1}
    )
    msg = make_instruction(ArrayRecord(make_model(full, 10, 1).state_dict()), config)
    reply = resident.forward("train", msg, ctx)  # the worker's error reply, passed on whole
    assert reply.has_error() and "ValueError" in reply.error.reason
    assert "holds only partition 2's data" in reply.error.reason
    assert "Traceback (most recent call last)" in reply.error.reason


def test_a_simulated_client_and_an_opted_out_node_do_the_work_themselves():
    from conftest import make_context

    ctx = make_context(1)
    assert not resident.enabled(ctx)  # simulation: the worker process is already resident
    ctx.node_config["data-path"] = "/data/client_1.npz"
    assert resident.enabled(ctx)
    for off in ("false", "0", "off", False):
        ctx.node_config["resident"] = off
        assert not resident.enabled(ctx)
    ctx.node_config["resident"] = "flase"  # a typo is an error, not a silent default
    with pytest.raises(ValueError, match="resident='flase': use true or false"):
        resident.enabled(ctx)


def test_a_runtime_directory_open_to_others_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    shared = tmp_path / f"feddb-resident-{os.getuid()}"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="closed to others"):
        resident.runtime_dir()

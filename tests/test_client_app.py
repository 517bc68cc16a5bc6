import json

import numpy as np
import pytest
import torch
from conftest import TINY, make_context, make_instruction
from flwr.app import ArrayRecord, ConfigRecord, MessageType

from client_app.app import app as client_app
from fssl.methods import make_model
from fssl.models import build_model
from server_app.config import compose


def with_meta(cfg):
    """What the ServerApp adds before sending the configuration."""
    from fssl.runtime import data_meta, dataset_for

    return {**cfg, "data_meta": data_meta(dataset_for(cfg))}


def _run(cfg, pid=1, server_round=1, mtype=MessageType.TRAIN, node_config=None, extra=None):
    cfg = with_meta(cfg)
    torch.manual_seed(0)
    model = make_model(cfg, 10, 1)
    arrays = ArrayRecord({k: v for k, v in model.state_dict().items()})
    config = ConfigRecord(
        {"server-round": server_round, "lr": 0.1, "client-config": json.dumps(cfg)}
    )
    ctx = make_context(pid)
    ctx.node_config.update(node_config or {})
    ins = make_instruction(arrays, config, mtype)
    for name, record in (extra or {}).items():
        ins.content[name] = record
    return model, client_app(ins, ctx)


@pytest.mark.parametrize("method", ["feddb", "fixmatch", "fedavg", "fedrgd", "semifl", "fedmatch"])
def test_train_reply_carries_model_app_u_and_metrics(method):
    cfg = compose(TINY + [f"method={method}"])
    model, reply = _run(cfg)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    out = reply.content["arrays"].to_torch_state_dict()
    ref = model.state_dict()
    assert list(out) == list(ref) and all(out[k].shape == ref[k].shape for k in ref)
    assert any(not torch.equal(out[k], ref[k]) for k in ref)  # it trained
    m = reply.content["metrics"]
    assert m["partition_id"] == 1
    app_u = np.array(m["app_u"])
    assert app_u.shape == (10,) and (app_u >= 0).all() and app_u.sum() == pytest.approx(1, abs=1e-5)
    assert np.array(m["app_u_global"]).sum() == pytest.approx(1, abs=1e-5)
    assert m["num_labeled"] > 0 and m["num_unlabeled"] > m["num_labeled"]
    assert sum(m["labeled_histogram"]) == m["num_labeled"]
    if method != "fedavg":
        assert 0 <= m["pseudo_label_ratio"] <= 1 and 0 <= m["pseudo_label_accuracy"] <= 1
    else:
        assert "pseudo_label_ratio" not in m and m["loss_unsup"] == 0.0


def test_fedmatch_client_uses_the_helpers_it_receives():
    from fssl.methods.fedmatch import psi_state

    cfg = compose(TINY + ["method=fedmatch", "train.tau=0.05"])  # every sample confident
    torch.manual_seed(5)
    helper = make_model(with_meta(cfg), 10, 1)
    psi = ArrayRecord(psi_state(helper.state_dict()))
    _, alone = _run(cfg)
    _, helped = _run(cfg, extra={"helper_0": psi, "helper_1": psi})
    assert alone.content["metrics"]["num_helpers"] == 0
    assert helped.content["metrics"]["num_helpers"] == 2
    a, b = (r.content["arrays"].to_torch_state_dict() for r in (alone, helped))
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the helpers changed training


def test_train_is_deterministic_per_seed_round_and_partition():
    cfg = compose(TINY)
    _, a = _run(cfg, pid=2, server_round=3)
    _, b = _run(cfg, pid=2, server_round=3)
    _, c = _run(cfg, pid=2, server_round=4)
    sa, sb, sc = (r.content["arrays"].to_torch_state_dict() for r in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_dpl_switch_changes_pseudo_labels():
    base = TINY + ["train.tau=0.12"]
    _, off = _run(compose(base + ["dpl=false"]), pid=0)
    _, on = _run(compose(base + ["dpl=true"]), pid=0)
    m_off, m_on = off.content["metrics"], on.content["metrics"]
    assert m_off["app_u_global"] == m_on["app_u_global"]  # same received model
    assert m_off["pseudo_label_count"] != m_on["pseudo_label_count"]


def test_evaluate_and_query():
    cfg = compose(TINY)
    _, reply = _run(cfg, mtype=MessageType.EVALUATE)
    m = reply.content["metrics"]
    assert 0 <= m["eval_accuracy"] <= 1 and m["num-examples"] > 0
    _, q = _run(cfg, pid=3, mtype=MessageType.QUERY)
    assert q.content["info"]["partition-id"] == 3


def test_bad_partition_id_is_refused():
    _, reply = _run(compose(TINY), pid=9)  # an error reply, with the traceback
    assert reply.has_error() and "ValueError: partition-id 9 is outside 0..3" in reply.error.reason
    assert "Traceback (most recent call last)" in reply.error.reason


def test_wrn28_2_on_cifar10_files(tmp_path):
    """The paper's model and a 3-channel dataset (flip on) through the ClientApp."""
    from test_data import write_cifar10

    write_cifar10(tmp_path)
    cfg = compose(
        [
            "experiment=paper/cifar10_iid",
            f"dataset.path={tmp_path}",
            "fl.num_clients=2",
            "fl.min_train_clients=1",
            "dataset.num_labeled=20",
            "train.local_epochs=1",
            "train.tau=0.1",
            "dataset.val_size=0",
        ]
    )
    torch.manual_seed(0)
    model = build_model(cfg["model"], 10, 3)
    config = ConfigRecord(
        {"server-round": 1, "lr": 0.03, "client-config": json.dumps(with_meta(cfg))}
    )
    arrays = ArrayRecord({k: v for k, v in model.state_dict().items()})
    reply = client_app(make_instruction(arrays, config), make_context(0, 2))
    m = reply.content["metrics"]
    assert m["num_labeled"] == 10 and m["num_unlabeled"] == 50
    assert len(m["app_u"]) == 10 and m["pseudo_label_count"] > 0
    assert set(reply.content["arrays"].keys()) == set(model.state_dict().keys())


def test_deployed_client_reads_only_its_own_file_and_trains_identically(tmp_path):
    from fssl.data import DataError, write_client_files
    from fssl.runtime import dataset_for, partition_for

    cfg = compose(TINY)
    part = partition_for(cfg)
    files = write_client_files(dataset_for(cfg), part.labeled, part.unlabeled, tmp_path)
    _, sim = _run(cfg, pid=2)
    _, dep = _run(cfg, pid=2, node_config={"data-path": str(files[2])})
    a, b = (r.content["arrays"].to_torch_state_dict() for r in (sim, dep))
    assert all(torch.equal(a[k], b[k]) for k in a)
    timing = {"train_seconds": 0, "setup_seconds": 0, "reply_seconds": 0}
    timing |= {"process_seconds": 0, "relay_seconds": 0}  # a deployed message's own costs
    assert dict(sim.content["metrics"]) | timing == dict(dep.content["metrics"]) | timing
    # without hidden labels: training works, pseudo-label accuracy is simply not reported
    with np.load(files[1]) as z:
        np.savez(tmp_path / "nolabels.npz", **{k: z[k] for k in z.files if k != "y_unlabeled"})
    _, nolab = _run(cfg, pid=1, node_config={"data-path": str(tmp_path / "nolabels.npz")})
    assert "pseudo_label_accuracy" not in nolab.content["metrics"]
    _, missing = _run(cfg, pid=0, node_config={"data-path": str(tmp_path / "missing.npz")})
    assert missing.has_error() and f"{DataError.__name__}: client data file not found" in (
        missing.error.reason
    )


def test_optimizer_state_client_keeps_momentum_in_context_state():
    """train.optimizer_state=client: the SGD momentum of a client's last round (stored in Flower's
    context.state) seeds its next round; `fresh` stores nothing and restarts it."""

    def two_rounds(mode):
        cfg = with_meta(compose(TINY + [f"train.optimizer_state={mode}"]))
        torch.manual_seed(0)
        model = make_model(cfg, 10, 1)
        ctx = make_context(1)
        replies = []
        for r in (1, 2):
            config = ConfigRecord({"server-round": 5, "lr": 0.1, "client-config": json.dumps(cfg)})
            arrays = ArrayRecord({k: v for k, v in model.state_dict().items()})
            replies.append(client_app(make_instruction(arrays, config), ctx))
            if r == 1:
                stored = (
                    {
                        k: v.clone()
                        for k, v in ctx.state["optimizer-1"].to_torch_state_dict().items()
                    }
                    if "optimizer-1" in ctx.state.array_records
                    else None
                )
        return replies, stored, ctx

    (f1, f2), fresh_stored, fresh_ctx = two_rounds("fresh")
    (c1, c2), kept, ctx = two_rounds("client")
    assert fresh_stored is None and "optimizer-1" not in fresh_ctx.state.array_records
    params = dict(make_model(with_meta(compose(TINY)), 10, 1).named_parameters())
    assert set(kept) == set(params) and all(kept[k].abs().sum() > 0 for k in kept)
    state = lambda r: r.content["arrays"].to_torch_state_dict()  # noqa: E731
    same = lambda a, b: all(torch.equal(state(a)[k], state(b)[k]) for k in state(a))  # noqa: E731
    assert same(f1, f2) and same(f1, c1)  # identical inputs, no carried state
    assert not same(c1, c2)  # the carried momentum changed round 2


def test_a_deployed_message_reports_its_process_and_relay_seconds(monkeypatch):
    """A deployed node's reply carries what its message process cost beside the work: from the
    process's start to the ClientApp imported, and the handling beyond the work's own set-up,
    training and reply (the relay to the resident worker)."""
    import time

    from conftest import patch_task_identity
    from flwr.app import Message, MetricRecord, RecordDict

    from client_app.app import with_process_times

    patch_task_identity(monkeypatch)
    work = {"setup_seconds": 0.2, "train_seconds": 0.3, "reply_seconds": 0.1}
    reply = Message(
        RecordDict({"metrics": MetricRecord(dict(work))}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    with_process_times(reply, time.time() - 1.0)
    metrics = reply.content["metrics"]
    assert 0.39 < metrics["relay_seconds"] < 1.0
    assert 0.0 <= metrics["process_seconds"] < time.time()

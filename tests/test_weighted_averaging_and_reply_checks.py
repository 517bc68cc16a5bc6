import json

import numpy as np
import pytest
import torch
from conftest import make_metadata, make_reply
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from fssl.instruction import Instruction
from fssl.methods.dma import dma_weights
from server_app.config import compose
from strategy import MethodStrategy, make_strategy

K = 3


def _cfg(*extra):
    return compose(
        [
            "fl.num_clients=4",
            "fl.fraction_train=0.5",
            "server.weighting=uniform",
            "train.warmup_rounds=0",
            *extra,
        ]
    )


def _global():
    return {
        "w": np.array([1.0, 2.0], np.float32),
        "bn.running_mean": np.zeros(2, np.float32),
        "bn.num_batches_tracked": np.array(0, np.int64),
    }


def _metrics(pid, app_u, **extra):
    m = {
        "partition_id": pid,
        "num_labeled": 10 * (pid + 1),
        "num_unlabeled": 90,
        "app_u": list(map(float, app_u)),
        "app_u_global": [1 / K] * K,
        "pseudo_label_ratio": 0.5,
        "pseudo_label_accuracy": 0.9,
        "pseudo_label_count": 3,
        "labeled_histogram": [1, 2, 3],
    }
    m.update(extra)
    return m


def _client(w, rm=0.5, n=3):
    return {
        "w": np.array(w, np.float32),
        "bn.running_mean": np.full(2, rm, np.float32),
        "bn.num_batches_tracked": np.array(n, np.int64),
    }


def _start(strategy, global_arrays):
    strategy.global_arrays = global_arrays
    strategy.begin_round(1, [])


def test_uniform_average_with_server_momentum_on_hand_built_replies():
    s = make_strategy(_cfg("dma.enabled=false", "server.momentum=0.5"), K)
    assert type(s) is MethodStrategy
    _start(s, _global())
    replies = [
        make_reply(_client([3.0, 2.0], 1.0, 4), _metrics(1, [0.2, 0.3, 0.5]), node=11),
        make_reply(_client([1.0, 4.0], 0.0, 2), _metrics(0, [0.5, 0.3, 0.2]), node=10),
    ]
    arrays, _ = s.aggregate_train(1, replies)
    out = {k: v.numpy() for k, v in arrays.items()}
    # avg = (2, 3); buf = w - avg = (-1, -1); w - buf = (2, 3)
    assert np.allclose(out["w"], [2.0, 3.0])
    assert np.allclose(out["bn.running_mean"], [0.5, 0.5])  # averaged, no momentum
    assert out["bn.num_batches_tracked"] == 4 and out["w"].dtype == np.float32
    assert [c["partition_id"] for c in s.round_record.clients] == [0, 1]  # sorted by partition
    assert [c["weight"] for c in s.round_record.clients] == [0.5, 0.5]
    # round 2: buf = 0.5 * (-1, -1) + (w - avg) with avg = (2, 4): (-0.5, -1.5) -> w = (2.5, 4.5)
    _start(s, out)
    replies = [
        make_reply(_client([2.0, 4.0]), _metrics(0, [0.4, 0.3, 0.3]), node=10),
        make_reply(_client([2.0, 4.0]), _metrics(2, [0.4, 0.3, 0.3]), node=12),
    ]
    arrays, _ = s.aggregate_train(2, replies)
    assert np.allclose(arrays["w"].numpy(), [2.5, 4.5])


def test_sample_weighting():
    s = make_strategy(_cfg("dma.enabled=false", "server.momentum=0", "server.weighting=samples"), K)
    _start(s, _global())
    replies = [
        make_reply(_client([0.0, 0.0]), _metrics(0, [0.2, 0.3, 0.5]), node=10),
        make_reply(_client([1.0, 1.0]), _metrics(1, [0.5, 0.3, 0.2]), node=11),
    ]
    arrays, _ = s.aggregate_train(1, replies)
    # sizes 100 and 110
    assert np.allclose(arrays["w"].numpy(), [110 / 210] * 2, atol=1e-6)


def test_dma_weights_are_applied_and_logged():
    s = make_strategy(_cfg("server.momentum=0"), K)
    assert type(s) is MethodStrategy and s.cfg["dma"]["enabled"]
    _start(s, _global())
    apps = [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.1, 0.1, 0.8]]
    replies = [
        make_reply(_client([float(i), 0.0]), _metrics(i, a), node=20 + i)
        for i, a in enumerate(apps)
    ]
    arrays, _ = s.aggregate_train(1, replies)
    expected = dma_weights(np.array(apps))
    got = np.array([c["weight"] for c in s.round_record.clients])
    assert np.allclose(got, expected.weights)
    assert got[0] > got[2]  # the over-represented class is down-weighted
    assert np.isclose(arrays["w"].numpy()[0], got @ np.arange(4), atol=1e-6)
    d = s.round_record.dma
    assert d["loss_weights"] < d["loss_uniform"] and d["weight_entropy"] < np.log(4)


def test_bad_replies_are_dropped_and_too_few_skip_the_round():
    s = make_strategy(_cfg("fl.min_train_clients=2"), K)
    _start(s, _global())
    nan = _client([np.nan, 0.0])
    replies = [
        make_reply(_client([1.0, 1.0]), _metrics(0, [0.2, 0.3, 0.5]), node=10),
        make_reply(_client([1.0, 1.0]), _metrics(1, [0.5, 0.5]), node=11),
        make_reply(_client([1.0, 1.0]), _metrics(2, [0.5, 0.6, 0.2]), node=12),
        make_reply(nan, _metrics(3, [0.2, 0.3, 0.5]), node=13),
    ]
    arrays, _ = s.aggregate_train(1, replies)
    assert arrays is None and s.round_record.skipped
    reasons = {f["node_id"]: f["reason"] for f in s.round_record.failures}
    assert "length 2, expected 3" in reasons[11]
    assert "sum to 1" in reasons[12] and "non-finite" in reasons[13]


def test_sampling_is_seeded_by_partition_not_node_ids():
    a, b = make_strategy(_cfg(), K), make_strategy(_cfg(), K)
    a.intake.bind_nodes({p: 1000 + p for p in range(4)})
    b.intake.bind_nodes({p: 77 * p + 5 for p in range(4)})
    rounds_a = [a.sampler.sample(r, 0.5) for r in range(1, 20)]
    assert rounds_a == [b.sampler.sample(r, 0.5) for r in range(1, 20)]
    assert all(len(p) == 2 for p in rounds_a) and len({tuple(p) for p in rounds_a}) > 1
    c = make_strategy(_cfg("seed=5"), K)
    assert [c.sampler.sample(r, 0.5) for r in range(1, 20)] != rounds_a


def test_always_sample_puts_a_partition_in_every_round():
    plain = make_strategy(_cfg("fl.num_clients=20", "fl.fraction_train=0.25"), K)
    forced = make_strategy(
        _cfg("fl.num_clients=20", "fl.fraction_train=0.25", "fl.always_sample=[3]"), K
    )
    rounds = [forced.sampler.sample(r, 0.25) for r in range(1, 41)]
    assert all(len(p) == 5 == len(set(p)) and 3 in p for p in rounds)
    assert (
        sum(3 in plain.sampler.sample(r, 0.25) for r in range(1, 41)) < 40
    )  # drawn by chance only
    others = {q for p in rounds for q in p if q != 3}
    assert len(others) > 10 and others <= set(range(20))  # the rest still drawn at random


def test_configure_train_sends_config_and_lr(task_identity):
    cfg = _cfg("train.lr=0.2", "num_rounds=10")
    s = make_strategy(cfg, K)
    s.intake.bind_nodes({p: 100 + p for p in range(4)})
    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    msgs = list(s.configure_train(6, arrays, ConfigRecord(), grid=None))
    assert sorted(m.metadata.dst_node_id for m in msgs) == [
        100 + p for p in s.sampler.sample(6, 0.5)
    ]
    conf = msgs[0].content["config"]
    assert conf["server-round"] == 6
    assert conf["lr"] == pytest.approx(0.2 * 0.5 * (1 + np.cos(np.pi * 5 / 10)))
    client = json.loads(conf["client-config"])
    assert client["train"]["lr"] == 0.2
    # only the client's part goes on the wire: no server-only section or key
    server_only = {"dma", "server", "dp", "logging", "checkpoint", "strategy", "num_rounds"}
    assert not server_only & set(client) and set(client["fl"]) == {"num_clients"}
    assert set(client["eval"]) == {"batch_size"} and "output_dir" not in client
    assert set(msgs[0].content.config_records) == {"config"}  # no strategy terms here


def test_federated_evaluation_is_optional_and_aggregated(task_identity):
    from flwr.app import MetricRecord

    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    off = make_strategy(_cfg(), K)
    off.intake.bind_nodes({p: 100 + p for p in range(4)})
    assert list(off.configure_evaluate(1, arrays, ConfigRecord(), grid=None)) == []
    on = make_strategy(_cfg("fl.fraction_evaluate=1.0"), K)
    on.intake.bind_nodes({p: 100 + p for p in range(4)})
    msgs = list(on.configure_evaluate(1, arrays, ConfigRecord(), grid=None))
    assert sorted(m.metadata.dst_node_id for m in msgs) == [100, 101, 102, 103]
    replies = []
    for i, (acc, n) in enumerate([(1.0, 10), (0.0, 30)]):
        ins = Message(content=RecordDict(), metadata=make_metadata(src=0, dst=100 + i))
        rec = RecordDict(
            {"metrics": MetricRecord({"eval_accuracy": acc, "eval_loss": 1.0, "num-examples": n})}
        )
        replies.append(Message(content=rec, reply_to=ins))
    agg = on.aggregate_evaluate(1, replies)
    assert agg["eval_accuracy"] == pytest.approx(0.25)  # weighted by examples


def test_odd_optional_metrics_do_not_break_the_round():
    s = make_strategy(_cfg("dma.enabled=false"), K)
    _start(s, _global())
    odd = _metrics(
        0,
        [0.2, 0.3, 0.5],
        loss_sup=[1.0, 2.0],
        pseudo_label_accuracy=float("nan"),
        labeled_histogram=[0.5, 1.5],
    )
    del odd["app_u_global"]
    replies = [
        make_reply(_client([1.0, 1.0]), odd, node=10),
        make_reply(_client([1.0, 1.0]), _metrics(1, [0.5, 0.3, 0.2]), node=11),
    ]
    arrays, _ = s.aggregate_train(1, replies)
    assert arrays is not None
    rec = s.round_record.clients[0]
    assert rec["loss_sup"] is None and rec["pseudo_label_accuracy"] is None
    assert rec["app_u_global"] == [] and rec["labeled_histogram"] == [0, 1]


def test_reply_claiming_another_partition_or_dtype_is_dropped():
    s = make_strategy(_cfg("dma.enabled=false"), K)
    s.intake.bind_nodes({0: 10, 1: 11, 2: 12})
    _start(s, _global())
    wrong_dtype = _client([1.0, 1.0])
    wrong_dtype["w"] = wrong_dtype["w"].astype(np.float64)
    replies = [
        make_reply(_client([1.0, 1.0]), _metrics(2, [0.2, 0.3, 0.5]), node=10),
        make_reply(wrong_dtype, _metrics(1, [0.5, 0.3, 0.2]), node=11),
        make_reply(_client([1.0, 1.0]), _metrics(2, [0.5, 0.3, 0.2]), node=12),
    ]
    s.aggregate_train(1, replies)
    reasons = {f["partition_id"]: f["reason"] for f in s.round_record.failures}
    assert "claims partition 2 but the node was sent 0" in reasons[0]
    assert "float64[2], expected float32[2]" in reasons[1]


@pytest.mark.parametrize(
    "value",
    [
        np.random.default_rng(0).random((3, 4), dtype=np.float32),
        np.array(5, dtype=np.int64),
        np.zeros((0, 3)),
        np.arange(10, dtype=np.uint8),
        np.ones((2, 3, 4), dtype=np.float16),
        np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        np.array([1, 2], dtype=">i4"),
    ],
)
def test_fast_array_conversion_equals_flowers(value):
    """array_to_numpy reads the data in place of Flower's header parse: same values, dtype and
    shape for every kind of array (Fortran order and foreign byte order fall back to Flower)."""
    from strategy.contract import array_to_numpy

    array = Array(value)
    got, want = array_to_numpy(array), array.numpy()
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    got[...] = 0 if got.size else got  # a writable copy, not a view of the message


def test_overhead_split_and_floor_app_are_valid(tmp_path):
    """`feddb overhead`: the parts add up as documented, and Flower accepts the echo app."""
    import textwrap

    from flwr.supercore.object_ref import validate

    from benchmarks.overhead import FLOOR_APP, FLOOR_PYPROJECT, split

    rec = {
        "round_seconds": 1.0,
        "clients": [{"setup_seconds": 0.1, "train_seconds": 0.4, "reply_seconds": 0.05}] * 4,
        "timing": {
            "configure": 0.01,
            "communicate": 0.3,
            "aggregate": 0.1,
            "evaluate": 0.5,
            "record_previous_round": 0.02,
            "checkpoint_previous_round": 0.03,
            "loss_check": 0.07,
        },
    }  # a part of "aggregate"
    part = split([rec] * 4, workers=2)
    assert part["client_pass_critical"] == pytest.approx(0.8)
    assert part["overhead"] == pytest.approx(0.2)
    assert part["server_work"] == pytest.approx(0.66) and part["loss_check"] == pytest.approx(0.07)
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(FLOOR_PYPROJECT))
    (tmp_path / "floorapp.py").write_text(FLOOR_APP.format(nodes=20, per_round=10))
    for ref in ("floorapp:server", "floorapp:client"):
        assert validate(ref, project_dir=tmp_path) == (True, None)


def test_overhead_times_the_servers_aggregation_with_its_defences(capsys):
    """`feddb overhead --aggregation`: DMA and the update with the default defences, on the
    strategy's own methods (the norm bound and the agreement filter saw every update)."""
    from benchmarks.overhead import aggregation_seconds, main

    seconds, robust = aggregation_seconds([], clients=4, repeats=2)
    assert len(seconds) == 2 and all(0 < s < 60 for s in seconds)
    assert len(robust["update_norms"]) == 4 and len(robust["cosines"]) == 4
    with pytest.raises(SystemExit):
        main(["--experiment", "paper/cifar10_dir0.3"])  # only with --aggregation
    with pytest.raises(SystemExit) as exit_:
        main(["--aggregation", "--experiment", "nope"])
    assert exit_.value.code == 2 and "unknown experiment 'nope'" in capsys.readouterr().err


def test_overhead_floor_only_takes_the_experiments_federation_and_arrays(capsys):
    """`feddb overhead --floor-only --experiment E`: the echo floor in E's federation (the paper's
    100 nodes, 10 a round) with E's model's arrays (WRN-28-2); a bad preset is one line, exit 2."""
    from benchmarks.overhead import federation, main, model_shapes

    paper = ["experiment=paper/cifar10_dir0.3"]
    assert federation(paper) == (100, 10)
    shapes = model_shapes(paper)
    assert shapes["features.0.weight"] == [16, 3, 3, 3]  # colour images in
    assert sum(int(np.prod(s)) for s in shapes.values()) > 1_400_000  # WRN-28-2, not the CNN
    assert main(["--floor-only", "--experiment", "nope"]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err


def test_the_deployment_overhead_report_sets_each_app_against_the_floor():
    """`feddb overhead --deployment`: the round's parts from metrics.jsonl records (the first
    rounds and the last, its final evaluation, left out), and each app's round against Flower's
    echo floor, pair by pair."""
    from benchmarks.deployoverhead import SKIP, report, where

    client = {"setup_seconds": 0.1, "train_seconds": 0.5, "reply_seconds": 0.1}
    records = (
        [{"round_seconds": 9.0, "clients": [client]}] * SKIP
        + [{"round_seconds": 4.0, "clients": [client, {**client, "train_seconds": 1.0}]}] * 3
        + [{"round_seconds": 30.0, "clients": [client]}]
    )
    part = where(records)
    assert part["round"] == 4.0 and part["train_seconds"] == 1.0
    assert part["rest"] == pytest.approx(4.0 - 1.2)
    pairs = [{"floor": 2.0, "null": part}, {"floor": 4.0, "null": {**part, "round": 5.0}}]
    res = {"nodes": 3, "rounds": 8, "floor": 3.0, "null": {**part, "round": 4.5}, "pairs": pairs}
    text = report({**res, "training": {"round": 6.0}, "no_step": {"round": 5.0}})
    assert "(1.50x the floor; pair by pair 2.00x, 1.25x)" in text
    assert "(1.67x the floor; train.local_epochs=0" in text and "(2.00x the floor)" in text


def test_the_null_trainer_returns_the_model_it_received_without_a_pass():
    """The deployment benchmark's null trainer: the received model back, a uniform APP-U, and
    none of the data's images read through the model."""
    from benchmarks.nulltrainer import NullTrainer
    from fssl.train import ClientData

    class Untouchable(torch.nn.Module):
        def forward(self, x):
            raise AssertionError("the null trainer ran the model")

    y_l = torch.tensor([0, 1, 1, 2])
    data = ClientData(torch.zeros(4, 1, 2, 2), y_l, torch.zeros(6, 1, 2, 2), torch.zeros(6))
    trainer = NullTrainer.__new__(NullTrainer)
    trainer.num_classes = 3
    metrics = trainer.fit(Untouchable(), data, Instruction(0.1, 0))
    assert metrics["app_u"] == [1 / 3] * 3 and metrics["labeled_histogram"] == [1, 2, 1]
    assert metrics["num_unlabeled"] == 6 and trainer.momentum_out == {}


def test_a_negative_running_variance_is_refused_as_malformed():
    """A BatchNorm variance below 0 (w + 1000·Δ sent on every array did this in a deployment)
    makes every later loss NaN; the norm bound only scales it, so the reply check refuses it."""
    from strategy.contract import ReplyError, parse_train_reply

    glob = {**_global(), "bn.running_var": np.ones(2, np.float32)}
    ok = make_reply(
        {**_client([1.0, 1.0]), "bn.running_var": np.array([0.0, 2.0], np.float32)},
        _metrics(0, [0.2, 0.3, 0.5]),
        node=10,
    )
    bad = make_reply(
        {**_client([1.0, 1.0]), "bn.running_var": np.array([1.0, -0.1], np.float32)},
        _metrics(1, [0.2, 0.3, 0.5]),
        node=11,
    )
    assert parse_train_reply(ok, glob, K, None)["arrays"]["bn.running_var"][0] == 0.0
    with pytest.raises(ReplyError, match="'bn.running_var' has negative variances"):
        parse_train_reply(bad, glob, K, None)


def test_a_methods_own_figures_are_checked_like_every_reply_field():
    """`method:<name>` metrics (LocalTrainer.client_metrics) from an untrusted reply: names must
    be identifiers and at most 16 of them, else the reply is refused; a non-finite value is kept
    as null."""
    from strategy.contract import ReplyError, client_record, parse_train_reply

    def parse(**extra):
        reply = make_reply(_client([1.0, 2.0]), _metrics(0, [0.2, 0.3, 0.5], **extra), node=10)
        return parse_train_reply(reply, _global(), K, None)

    good = parse(**{"method:mu": 0.7, "method:var": float("nan")})
    assert client_record(good["metrics"], 1.0)["method"] == {"mu": 0.7, "var": None}
    with pytest.raises(ReplyError, match="not identifiers"):
        parse(**{"method:bad name!": 1.0})
    with pytest.raises(ReplyError, match="17 method metrics, more than 16"):
        parse(**{f"method:m{i}": 1.0 for i in range(17)})


def test_an_error_reply_is_read_whole_whether_ours_or_flowers():
    """Ours: the reason, a marker, the traceback; Flower's own reasons may span lines (its
    ClientAppException begins with one) and carry no traceback: kept whole, on one line."""
    from flwr.app import Error, Message, RecordDict

    from strategy.contract import error_of, error_reply

    ins = Message(content=RecordDict(), metadata=make_metadata(src=0, dst=3))
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError as err:
        import traceback

        ours = error_reply(ins, err, traceback.format_exc())
    reason, trace = error_of(ours)
    assert reason == "RuntimeError: boom second line" and trace.startswith("Traceback")
    flowers = Message(
        Error(2, "<class 'X'>:<'\nException ClientApp Message: cause'>"), reply_to=ins
    )
    assert error_of(flowers) == ("<class 'X'>:<' Exception ClientApp Message: cause'>", "")


def test_a_resumed_run_keeps_the_rounds_that_trained_no_client():
    from fssl.record import RoundMetrics
    from server_app.rounds import failed_before

    lines = [
        {
            "round": 1,
            "sampled": 2,
            "failures": [
                {"partition_id": 0, "node_id": 5, "reason": "client error: X"},
                {"partition_id": 1, "node_id": 6, "reason": "client error: X"},
            ],
        },
        {"round": 2, "sampled": 2, "failures": [{"partition_id": 0, "node_id": 5, "reason": "y"}]},
        {"round": 3, "sampled": 0, "failures": []},  # labels at the server: no client asked
    ]
    history = [RoundMetrics.from_dict(line) for line in lines]  # as the recorder reads them
    assert failed_before(history) == [
        "round 1 trained no client (all 2 sampled failed; partition 0, node 5: client error: X)"
    ]

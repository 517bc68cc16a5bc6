"""Server-side robustness with the real ServerApp/strategy/ClientApp on an in-process grid:
malformed and failing clients, crash and resume, determinism."""

import json
import pickle
import time

import numpy as np
import pytest
import torch
from conftest import make_metadata, patch_task_identity
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from localgrid import metrics_without_timing, run_in_process

from client_app.app import app as client_app
from fssl import checkpoint
from fssl.checks import ConfigError
from server_app.config import resolve
from server_app.rounds import RunFailed

ROUNDS = 4
OVERRIDES = (
    "fl.num_clients=6 fl.fraction_train=0.5 dataset.num_labeled=100 train.local_epochs=1 "
    "train.tau=0.6 fl.node_wait=0 checkpoint.every=2 train.warmup_rounds=0 model.width=8"
)


pytestmark = pytest.mark.usefixtures("task_identity")


def run_server(
    run_dir, data, hook=None, resume=False, overrides=OVERRIDES, fraction=None, app=None
):
    if resume:
        rc = {"resume": str(run_dir)}
    else:
        extra = f" fl.fraction_train={fraction}" if fraction else ""
        rc = {
            "dataset": "npz",
            "data-path": str(data),
            "num-server-rounds": ROUNDS,
            "seed": 4,
            "output-dir": str(run_dir),
            "overrides": overrides + extra,
        }
    run_in_process(rc, 6, hook, app)
    return run_dir


records = metrics_without_timing


def round_of(ins):
    return int(ins.content["config"]["server-round"]) if "config" in ins.content else 0


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, small_npz):
    mp = pytest.MonkeyPatch()
    patch_task_identity(mp)
    run_dir = run_server(tmp_path_factory.mktemp("base") / "run", small_npz)
    mp.undo()
    return run_dir


def test_same_seed_gives_identical_metrics(baseline, small_npz, tmp_path):
    again = run_server(tmp_path / "again", small_npz)
    assert records(again) == records(baseline)
    assert len(records(baseline)) == ROUNDS


def test_overlapped_rounds_give_the_same_run(baseline, small_npz, tmp_path):
    """Round t + 1's instructions go out before round t is evaluated and checkpointed when the
    grid queues them (as a SuperLink does): the run is the same, bit for bit."""
    run_dir = tmp_path / "overlap"
    run_in_process(
        {
            "dataset": "npz",
            "data-path": str(small_npz),
            "num-server-rounds": ROUNDS,
            "seed": 4,
            "output-dir": str(run_dir),
            "overrides": OVERRIDES,
        },
        6,
        overlap=True,
    )
    assert records(run_dir) == records(baseline)
    timing = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["timing"]
    assert {"configure", "communicate", "aggregate", "evaluate"} <= set(timing)
    a = torch.load(run_dir / "final_model.pt", weights_only=True)
    b = torch.load(baseline / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_evaluation_cadence_records_every_round_and_trains_the_same_run(
    baseline, small_npz, tmp_path
):
    """eval.every=3: rounds 3 and 4 (the last) are evaluated, 1 and 2 recorded without
    accuracies; training, the final model and the summary's figures of those rounds unchanged."""
    run_dir = run_server(tmp_path / "every3", small_npz, overrides=OVERRIDES + " eval.every=3")
    got, base = records(run_dir), records(baseline)
    assert [r["round"] for r in got] == [1, 2, 3, 4]
    assert [r["evaluated"] for r in got] == [False, False, True, True]
    assert all(r["test_accuracy"] is None and r["class_accuracy"] is None for r in got[:2])
    for r, b in zip(got[2:], base[2:]):
        assert r["test_accuracy"] == b["test_accuracy"] and r["val_accuracy"] == b["val_accuracy"]
    no_js = lambda recs: [
        [
            {k: v for k, v in c.items() if not k.startswith("js_")}  # noqa: E731
            for c in r["clients"]
        ]
        for r in recs
    ]
    assert no_js(got) == no_js(base)  # JS needs the last round's class accuracy
    assert got[0]["clients"] == base[0]["clients"] and got[2]["js_divergence"] is None
    a = torch.load(run_dir / "final_model.pt", weights_only=True)
    b = torch.load(baseline / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == ROUNDS and summary["evaluated_rounds"] == 2
    assert summary["final_test_accuracy"] == base[-1]["test_accuracy"]
    assert summary["best_round"] in (3, 4)  # the best of the rounds evaluated
    assert [s for s, _ in tensorboard_scalars(run_dir, "test/accuracy")] == [3, 4]


def test_fewer_nodes_than_clients_give_the_same_run(baseline, small_npz, tmp_path):
    """Two nodes for six clients (Flower's default simulation): each instruction names its
    partition, a node trains whichever it is sent, and the run is the one-node-per-client run."""
    run_dir = tmp_path / "two"
    run_in_process(
        {
            "dataset": "npz",
            "data-path": str(small_npz),
            "num-server-rounds": ROUNDS,
            "seed": 4,
            "output-dir": str(run_dir),
            "overrides": OVERRIDES,
        },
        2,
    )
    assert records(run_dir) == records(baseline)


def test_a_node_with_its_own_data_trains_no_other_partition(task_identity):
    from conftest import make_context

    from client_app.work import partition_of

    ctx = make_context(pid=1)
    msg = Message(
        RecordDict({"config": ConfigRecord({"partition-id": 3})}), metadata=make_metadata()
    )
    assert partition_of(msg, ctx, own_data=False) == 3
    with pytest.raises(ValueError, match="holds only partition 1's data"):
        partition_of(msg, ctx, own_data=True)


def crash_in_round_4_then_resume(run_dir, data, overrides=OVERRIDES):
    class Crash(BaseException):
        pass

    def crash_in_round_4(ins, ctx, reply):
        if round_of(ins) == 4:
            raise Crash()
        return reply

    with pytest.raises(Crash):
        run_server(run_dir, data, hook=crash_in_round_4, overrides=overrides)
    assert len(records(run_dir)) == 3  # round 3 written, checkpoint at 2
    _, state = checkpoint.load(run_dir)
    assert state["round"] == 2
    run_server(run_dir, data, resume=True)
    return run_dir


def tensorboard_scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_crash_then_resume_ends_with_the_same_result(baseline, small_npz, tmp_path):
    run_dir = crash_in_round_4_then_resume(tmp_path / "crashed", small_npz)
    assert records(run_dir) == records(baseline)
    # TensorBoard: one value per round, the rewritten rounds purged, equal to metrics.jsonl
    expected = [(r["round"], pytest.approx(r["test_accuracy"])) for r in records(baseline)]
    assert tensorboard_scalars(run_dir, "test/accuracy") == expected
    assert tensorboard_scalars(baseline, "test/accuracy") == expected
    assert len(tensorboard_scalars(baseline, "aggregation/dma_loss_weights")) == ROUNDS
    a = torch.load(run_dir / "final_model.pt", weights_only=True)
    b = torch.load(baseline / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_round"] == 2 and summary["rounds"] == ROUNDS


def test_what_clients_keep_between_rounds_survives_a_crash_and_resume(small_npz, tmp_path):
    """The clients' SGD momentum (the authors' regime) and a method's estimates (FlexMatch's)
    live on the nodes; in process the checkpoint holds them and the resumed run is the
    uninterrupted one (without them it is not: checked by hand). A launcher that cannot give
    them back (`flwr run`) refuses the resume with one line."""
    from feddb.launch import preflight

    overrides = f"{OVERRIDES} method=flexmatch train.optimizer_state=client"
    base = run_server(tmp_path / "base", small_npz, overrides=overrides)
    run_dir = crash_in_round_4_then_resume(tmp_path / "crashed", small_npz, overrides)
    assert records(run_dir) == records(base)
    groups, state = checkpoint.load(run_dir)
    assert state["nodes"] and any(g.startswith("node.") for g in groups)
    with pytest.raises(ConfigError, match="between rounds, which only an in-process run gives"):
        preflight(f"resume='{run_dir}'")


def test_fedmatch_server_caches_survive_a_crash_and_resume(small_npz, tmp_path):
    """Helpers in round 4 come from embeddings and psi cached in rounds 1-3; the checkpoint of
    round 2 must carry them for the resumed run to pick the same helpers."""
    overrides = OVERRIDES + " method=fedmatch method.helper_interval=2"
    base = run_server(tmp_path / "base", small_npz, overrides=overrides)
    assert records(base)[3]["helpers"]
    resumed = crash_in_round_4_then_resume(tmp_path / "crashed", small_npz, overrides)
    assert records(resumed) == records(base)


def _corrupt(ins, reply, kind):
    content = reply.content
    arrays = {k: v.numpy() for k, v in content["arrays"].items()}
    metrics = dict(content["metrics"])
    if kind == "nan":
        first = next(iter(arrays))
        arrays[first] = np.full_like(arrays[first], np.nan)
    else:
        metrics["app_u"] = [0.5, 0.5]
    rec = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "metrics": MetricRecord(metrics),
        }
    )
    return Message(content=rec, reply_to=ins)


def test_malformed_replies_are_excluded_reported_and_cost_only_those_clients(small_npz, tmp_path):
    bad = {0: "nan", 3: "app_u"}

    def faulty(ins, ctx, reply):
        pid = ctx.node_config["partition-id"]
        if (
            round_of(ins) in (1, 2)
            and pid in bad
            and not reply.has_error()
            and "arrays" in reply.content
        ):
            return _corrupt(ins, reply, bad[pid])
        return reply

    def lost(ins, ctx, reply):
        pid = ctx.node_config["partition-id"]
        if round_of(ins) in (1, 2) and pid in bad and "arrays" in reply.content:
            return None
        return reply

    with_faults = records(run_server(tmp_path / "faults", small_npz, faulty, fraction=1.0))
    with_losses = records(run_server(tmp_path / "lost", small_npz, lost, fraction=1.0))
    for r in with_faults[:2]:
        reasons = {f["partition_id"]: f["reason"] for f in r["failures"]}
        assert r["num_failures"] == 2 and not r["skipped"]
        assert "non-finite" in reasons[0] and "app_u has length 2" in reasons[3]
        assert {c["partition_id"] for c in r["clients"]} == {1, 2, 4, 5}
    assert with_faults[2]["num_failures"] == 0 and len(with_faults[2]["clients"]) == 6
    # exactly as if those clients had not answered
    assert [r["test_accuracy"] for r in with_faults] == [r["test_accuracy"] for r in with_losses]
    for r in with_losses[:2]:
        assert all("no reply" in f["reason"] for f in r["failures"])


def test_a_raising_client_does_not_end_the_run(small_npz, tmp_path):
    def raising_app(msg, ctx):
        if ctx.node_config["partition-id"] == 0 and round_of(msg) > 0:
            raise RuntimeError("boom")
        return client_app(msg, ctx)

    recs = records(run_server(tmp_path / "raise", small_npz, fraction=1.0, app=raising_app))
    assert len(recs) == ROUNDS
    for r in recs:
        assert [f["partition_id"] for f in r["failures"]] == [0]
        assert "RuntimeError: boom" in r["failures"][0]["reason"] and len(r["clients"]) == 5


def test_the_superlinks_error_for_a_silent_node_is_charged_to_that_nodes_partition(
    small_npz, tmp_path
):
    """Flower's SuperLink answers an instruction to a node that stopped sending heartbeats with
    an error reply of its own, whose source is not that node: the failure is charged to the
    partition the instruction was for, once, and no second 'no reply' is made up for it."""
    from flwr.app import Error

    def silent_partition_0(ins, ctx, reply):
        if ctx.node_config["partition-id"] != 0 or round_of(ins) != 2:
            return reply
        err = Message(Error(code=0, reason="Node Unavailable"), reply_to=ins)
        err.metadata.__dict__["_src_node_id"] = 1  # the SuperLink's own
        return err

    recs = records(run_server(tmp_path / "silent", small_npz, silent_partition_0, fraction=1.0))
    assert [f["partition_id"] for f in recs[1]["failures"]] == [0]
    assert "Node Unavailable" in recs[1]["failures"][0]["reason"]
    assert recs[1]["failures"][0]["node_id"] not in (None, 1)
    assert all(not r["failures"] for i, r in enumerate(recs) if i != 1)


def test_too_few_valid_replies_skip_the_round_and_keep_the_model(small_npz, tmp_path):
    def drop_all_round_2(ins, ctx, reply):
        return None if round_of(ins) == 2 and "arrays" in reply.content else reply

    with pytest.raises(RunFailed, match="round 2 trained no client"):  # exit 3 (feddb local)
        run_server(tmp_path / "skip", small_npz, drop_all_round_2)
    recs = records(tmp_path / "skip")
    assert len(recs) == ROUNDS  # one such round does not stop the run
    assert recs[1]["skipped"] and recs[1]["clients"] == [] and recs[1]["num_failures"] == 3
    assert recs[1]["test_accuracy"] == recs[0]["test_accuracy"]
    assert not recs[2]["skipped"]


def test_a_run_with_skipped_rounds_says_how_many_and_exits_4(
    baseline, small_npz, tmp_path, monkeypatch, capsys
):
    """`feddb local`, two of whose rounds get one valid reply (fl.min_train_clients=2): the run
    completes, but not as configured: summary.json lists the skipped rounds, the last line says
    how many, the exit is 4 (0 only when every round trained; a round with no client is exit 3)."""
    import functools

    from feddb import inprocess

    kept: dict[int, int] = {}

    def one_reply_in_rounds_2_and_3(ins, ctx, reply):
        if round_of(ins) not in (2, 3) or "arrays" not in reply.content:
            return reply
        kept[round_of(ins)] = kept.get(round_of(ins), 0) + 1
        return reply if kept[round_of(ins)] == 1 else None

    run = functools.partial(inprocess.run_in_process, num_nodes=6, hook=one_reply_in_rounds_2_and_3)
    monkeypatch.setattr(inprocess, "run_in_process", run)
    run_dir = tmp_path / "run"
    rc = (
        f"dataset='npz' data-path='{small_npz}' num-server-rounds={ROUNDS} seed=4 "
        f"output-dir='{run_dir}' overrides='{OVERRIDES}'"
    )
    assert inprocess.main(["--run-config", rc]) == 4
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1] == (
        "warning: 2 of 4 rounds skipped (round 2, 3: fewer valid replies than "
        "fl.min_train_clients, the global model kept); exit 4"
    )
    assert out.strip().splitlines()[-1].startswith("[feddb] rounds skipped: 2 of 4 rounds")
    assert json.loads((run_dir / "summary.json").read_text())["skipped_rounds"] == [2, 3]
    assert [r["skipped"] for r in records(run_dir)] == [False, True, True, False]
    assert json.loads((baseline / "summary.json").read_text())["skipped_rounds"] == []


def test_a_run_that_failed_at_start_up_leaves_nothing_that_blocks_its_command(
    small_npz, tmp_path, monkeypatch
):
    """A start-up crash after the run directory is written (here: binding the nodes) ended no
    round: the same command takes the directory again and completes, while a run that ended a
    round is still refused."""
    import server_app.app

    def crash(*args, **kwargs):
        raise RuntimeError("start-up crash")

    with monkeypatch.context() as mp, pytest.raises(RuntimeError, match="start-up crash"):
        mp.setattr(server_app.app, "bind_partitions", crash)
        run_server(tmp_path / "run", small_npz)
    assert (tmp_path / "run" / "config.yaml").is_file()
    run_server(tmp_path / "run", small_npz)
    assert [r["round"] for r in records(tmp_path / "run")] == list(range(1, ROUNDS + 1))
    with pytest.raises(ConfigError, match="holds a run"):
        run_server(tmp_path / "run", small_npz)


def test_checkpoint_roundtrip_is_atomic_and_refuses_pickled_objects(tmp_path):
    arrays = {
        "global": {"w": np.arange(3, dtype=np.float32), "n": np.array(4)},
        "strategy.momentum": {"w": np.ones(3)},
    }
    checkpoint.save(tmp_path, arrays, {"round": 7, "x": [1, 2]})
    got, state = checkpoint.load(tmp_path)
    assert state["round"] == 7 and state["x"] == [1, 2]
    assert np.array_equal(got["global"]["w"], arrays["global"]["w"])
    assert got["global"]["n"].shape == () and got["strategy.momentum"]["w"].dtype == np.float64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "checkpoint.pt.sha256"]

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"__state_json__": Evil()}, tmp_path / "checkpoint.pt")
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load(tmp_path, tmp_path / "checkpoint.pt")
    with pytest.raises(checkpoint.CheckpointError, match="checksum mismatch"):
        checkpoint.load(tmp_path)  # its recorded checksum no longer holds: never unpickled


def test_resume_input_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        resolve({"resume": str(tmp_path / "nothing")})
    with pytest.raises(ConfigError, match="remove \\['seed'\\]"):
        resolve({"resume": str(tmp_path), "seed": 3})


@pytest.mark.parametrize(
    "variant",
    [
        "method=fedrgd dpl=true",
        "method=semifl dpl=true dma.enabled=true",
        "method=fedmatch dpl=true method.helper_interval=2",
    ],
)
def test_every_baseline_runs_through_the_server_app(variant, small_npz, tmp_path):
    run_dir = run_server(tmp_path / "run", small_npz, overrides=f"{OVERRIDES} {variant}")
    recs = records(run_dir)
    assert [r["round"] for r in recs] == [1, 2, 3, 4] and not any(r["skipped"] for r in recs)
    assert all(r["gradient_diversity"] is not None and len(r["clients"]) == 3 for r in recs)
    if "fedrgd" in variant:
        assert all(sorted(len(g) for g in r["groups"]) == [1, 2] for r in recs)
    if "dma.enabled" in variant:
        assert all(r["dma"] is not None for r in recs)
    if "fedmatch" in variant:
        assert recs[1]["helpers"] and recs[3]["helpers"] and not recs[2]["helpers"]


def test_flower_strategy_state_survives_a_crash_and_resume(small_npz, tmp_path):
    """strategy=fedadam: its moments m_t and v_t are in the round-2 checkpoint, so the resumed run
    is the uninterrupted one, record for record."""
    overrides = OVERRIDES + " method=fixmatch strategy=fedadam strategy.params.eta=0.01"
    base = run_server(tmp_path / "base", small_npz, overrides=overrides)
    assert records(base)[-1]["strategy"]["name"] == "fedadam"
    resumed = crash_in_round_4_then_resume(tmp_path / "crashed", small_npz, overrides)
    assert records(resumed) == records(base)


def test_an_honest_simulation_with_the_defaults_runs_the_method_as_published(
    small_npz, tmp_path, capsys
):
    """No defence acts in a simulation (server.robust.scope=deployment): nothing clipped or
    dropped, DMA unbounded, one line says so and how to turn them on; the run records it."""
    run = run_server(
        tmp_path / "run",
        small_npz,
        overrides=OVERRIDES.replace("checkpoint.every=2", "checkpoint.every=0"),
    )
    out = capsys.readouterr().out
    assert out.count("a simulation runs the methods as published") == 1
    assert "server.robust.scope=always turns them on here" in out
    rounds = records(run)
    assert all(
        r["robust"] == {"rule": "mean", "clip": None}
        and r["dma"]["cap"] is None
        and r["dma"]["at_cap"] == 0
        for r in rounds
    )
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["defence_rounds"].values()) == {0}
    saved = (run / "config.yaml").read_text()
    assert "cap: null" in saved and "scope: deployment" in saved  # what ran, as it ran
    # the same federation with a deployment's defences: they act (here the norm bound measures
    # every update and the agreement filter every cosine)
    guarded = records(
        run_server(
            tmp_path / "guarded", small_npz, overrides=OVERRIDES + " server.robust.scope=always"
        )
    )
    assert all(
        r["robust"]["clip"] == 4.0 and len(r["robust"]["cosines"]) == 3 and r["dma"]["cap"] == 2.0
        for r in guarded
    )


def test_a_truncated_latest_checkpoint_resumes_from_the_previous_one(baseline, small_npz, tmp_path):
    """Checkpoints every round, a crash in round 4, then the latest checkpoint (round 3) cut in
    half: the resume says so, takes round 2's, keeps the corrupt file aside and the dropped
    round's first record, and ends with the metrics of the uninterrupted run."""
    from feddb.inprocess import main as local_main

    run_dir = tmp_path / "run"
    every_round = OVERRIDES.replace("checkpoint.every=2", "checkpoint.every=1")

    def crash_in_round_4(ins, ctx, reply):
        if round_of(ins) == 4:
            raise KeyboardInterrupt
        return reply

    with pytest.raises(KeyboardInterrupt):
        run_server(run_dir, small_npz, hook=crash_in_round_4, overrides=every_round)
    latest = run_dir / checkpoint.FILE
    assert checkpoint.load(run_dir, latest)[1]["round"] == 3
    assert checkpoint.load(run_dir, run_dir / checkpoint.PREVIOUS)[1]["round"] == 2
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])
    assert "checksum mismatch" in checkpoint.problem(latest)
    assert checkpoint.find(run_dir)[0].name == checkpoint.PREVIOUS
    run_server(run_dir, small_npz, resume=True)
    assert records(run_dir) == records(baseline)
    assert (run_dir / "checkpoint.corrupt.pt").is_file()  # kept, not overwritten
    dropped = [json.loads(line) for line in (run_dir / "metrics.dropped.jsonl").open()]
    assert [r["round"] for r in dropped] == [3]
    # both bad: refused before anything starts, naming the files, the directory unchanged
    for name in (checkpoint.FILE, checkpoint.PREVIOUS):
        (run_dir / name).write_bytes(b"not a checkpoint")
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    assert local_main(["--run-config", f"resume='{run_dir}'"]) == 2
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before


def info_reply(question, pid: int, own: int):
    """A node's answer to the partition query, as Flower delivers it."""
    from flwr.app import ConfigRecord as Config

    rec = RecordDict({"info": Config({"partition-id": pid, "own-data": own})})
    reply = Message(content=rec, reply_to=question)
    reply.metadata.__dict__["_src_node_id"] = question.metadata.dst_node_id
    return reply


class JoinStrategy:
    """The strategy's side of rebinding: which node holds each partition."""

    def __init__(self, node_of):
        from strategy.intake import ReplyIntake

        self.intake = ReplyIntake({"server": {"max_samples": None}}, 10)
        self.intake.bind_nodes(node_of)


def test_a_node_that_joins_mid_run_takes_its_partition_at_the_next_round():
    """A SuperNode restarted under a new node id (or one replacing a dead machine) answers the
    partition query before the next round, and its partition's instructions go to it; a node that
    names a partition outside the run, holds no data file of its own, or names the partition of a
    node still connected, is left out."""
    from server_app.nodes import RejoinedNodes

    # node -> (partition-id, own-data): 21 takes partition 0, whose node 10 has gone; 24 names
    # partition 2, whose node 12 is still connected, and takes nothing
    answers = {21: (0, 1), 22: (7, 1), 23: (1, 0), 24: (2, 1)}

    class Grid:
        synchronous = True  # answers at once, as the in-process grid does

        def get_node_ids(self):
            return [11, 12, 21, 22, 23, 24]

        def send_and_receive(self, msgs, timeout=None):
            for m in msgs:
                m.metadata.__dict__["_message_id"] = f"q{m.metadata.dst_node_id}"
            return [info_reply(m, *answers[m.metadata.dst_node_id]) for m in msgs]

    strategy = JoinStrategy({0: 10, 1: 11, 2: 12})
    assert RejoinedNodes(Grid(), strategy, 3)() == [0]
    assert strategy.intake.node_of == {0: 21, 1: 11, 2: 12} and strategy.intake.pids_on[21] == [0]


def test_a_joining_node_that_answers_late_costs_no_round_more_than_the_wait():
    """In a deployment a joining node's question waits `wait` s within a round, then stays open:
    the node is not asked again while it is, its late answer binds its partition before a later
    round, and a node that named no partition of the run is not asked again until `retry` s."""
    from server_app.nodes import RejoinedNodes

    class Grid:
        def __init__(self):
            self.nodes, self.asked, self.inbox, self.count = [11, 21, 22], [], {}, 0

        def get_node_ids(self):
            return self.nodes

        def push_messages(self, msgs):
            for m in msgs:
                self.count += 1
                m.metadata.__dict__["_message_id"] = f"q{self.count}"
                self.asked.append(m.metadata.dst_node_id)
            self.sent = {m.metadata.message_id: m for m in msgs}
            return list(self.sent)

        def answer(self, node, pid):
            m = next(m for m in self.sent.values() if m.metadata.dst_node_id == node)
            self.inbox[m.metadata.message_id] = info_reply(m, pid, 1)

        def pull_messages(self, ids):
            return [self.inbox.pop(i) for i in list(ids) if i in self.inbox]

    grid, strategy = Grid(), JoinStrategy({0: 10, 1: 11})
    rejoin = RejoinedNodes(grid, strategy, 2, wait=0.05, retry=60.0)
    t0 = time.monotonic()
    assert rejoin() == [] and time.monotonic() - t0 < 2.0  # nobody answered within the wait
    assert sorted(grid.asked) == [21, 22]
    grid.answer(22, 5)  # 22 names a partition outside the run
    assert rejoin() == [] and sorted(grid.asked) == [21, 22]  # open or refused: not asked again
    grid.answer(21, 0)  # late: partition 0, whose node 10 has gone
    assert rejoin() == [0] and strategy.intake.node_of == {0: 21, 1: 11}
    assert rejoin() == [] and sorted(grid.asked) == [21, 22] and not rejoin.open


def test_the_partition_query_asks_again_a_node_whose_answer_was_lost_or_malformed():
    """Replies are untrusted and, after a SuperLink restart, may arrive without their content or
    as Flower's 'objects unavailable' error, whose source is the server's own node id: the node
    that was asked is asked again (not the source), and one that never answers well ends the run
    with a line naming it and what was wrong, not a KeyError."""
    from flwr.app import ConfigRecord as Config
    from flwr.app import Error

    from server_app.nodes import NodeError, query_nodes

    class Grid:
        def __init__(self, script):
            self.script, self.asked = script, []

        def send_and_receive(self, msgs, timeout):
            out = []
            for m in msgs:
                node = m.metadata.dst_node_id
                m.metadata.__dict__["_message_id"] = f"q{node}-{len(self.asked)}"
                self.asked.append(node)
                kind = (
                    self.script[node].pop(0) if len(self.script[node]) > 1 else self.script[node][0]
                )
                if kind == "lost":  # as Flower's grid makes it: the server as the source
                    reply = Message(
                        Error(code=0, reason="Reply message objects are unavailable"), reply_to=m
                    )
                    reply.metadata.__dict__["_src_node_id"] = 0
                else:
                    content = (
                        RecordDict()
                        if kind == "empty"
                        else RecordDict(
                            {"info": Config({"partition-id": node - 10, "own-data": 1})}
                        )
                    )
                    reply = Message(content=content, reply_to=m)
                    reply.metadata.__dict__["_src_node_id"] = node
                out.append(reply)
            return out

    grid = Grid({10: ["empty", "ok"], 11: ["lost", "ok"], 12: ["ok"]})
    info = query_nodes(grid, [10, 11, 12], timeout=10.0, at_least=10.0)
    assert {n: v["pid"] for n, v in info.items()} == {10: 0, 11: 1, 12: 2}
    assert sorted(grid.asked) == [10, 10, 11, 11, 12]

    with pytest.raises(NodeError, match="node 10 failed to report its partition: .*'info'"):
        query_nodes(Grid({10: ["empty"]}), [10], timeout=1.0, at_least=1.0)


def test_a_deployment_starts_without_a_node_that_died_while_asked_its_partition(capsys):
    """Churn at start-up: node 11 was killed while the ServerApp asked each node its partition,
    and its reply never comes (Flower's 'objects unavailable'). The run starts with the others,
    says which partition waits, and that partition's instructions are not sent (a failure with
    its reason) until a node holding it answers before a later round; with fewer answering
    nodes than fl.min_train_clients it does not start."""
    from flwr.app import ConfigRecord as Config
    from flwr.app import Error

    from server_app.config import compose
    from server_app.nodes import NodeError, bind_partitions
    from strategy import make_strategy

    class Grid:
        def get_node_ids(self):
            return [10, 11, 12]

        def send_and_receive(self, msgs, timeout):
            out = []
            for m in msgs:
                node = m.metadata.dst_node_id
                m.metadata.__dict__["_message_id"] = f"q{node}"
                if node == 11:
                    reply = Message(
                        Error(code=0, reason="Reply message objects are unavailable"), reply_to=m
                    )
                else:
                    info = Config({"partition-id": node - 10, "own-data": 1})
                    reply = Message(RecordDict({"info": info}), reply_to=m)
                out.append(reply)
            return out

    node_of = bind_partitions(Grid(), 3, timeout=1.0, min_nodes=2, at_least=1.0)
    assert node_of == {0: 10, 2: 12}
    printed = capsys.readouterr().out
    assert "node 11 left out: no partition reported" in printed
    assert "partitions [1] have no node yet" in printed
    with pytest.raises(NodeError, match="only 2 of 3 nodes reported their partition"):
        bind_partitions(Grid(), 3, timeout=1.0, min_nodes=3, at_least=1.0)

    strategy = make_strategy(compose(["fl.num_clients=3"]), 10)
    strategy.intake.bind_nodes(node_of)
    sent = strategy.messages([0, 1, 2], ArrayRecord(), 1, "train")
    assert [m.metadata.dst_node_id for m in sent] == [10, 12]


BROKEN_METHOD = """
from fssl.methods.fixmatch import FixMatch


class Broken(FixMatch):
    def fit(self, *args, **kwargs):
        raise RuntimeError("boom in fit")
"""


def test_a_run_whose_clients_all_fail_exits_3_with_the_cause_and_keeps_their_tracebacks(
    small_npz, tmp_path, capsys
):
    """`feddb local` with a user's method whose fit raises: every round trains no client; the run
    stops after fl.max_failed_rounds such rounds in a row, exits 3 with one line naming the
    first cause, and keeps the clients' tracebacks in the run directory."""
    from feddb import inprocess

    method = tmp_path / "broken.py"
    method.write_text(BROKEN_METHOD)
    run_dir = tmp_path / "run"
    rc = (
        f"method='{method}:Broken' dataset='npz' data-path='{small_npz}' num-server-rounds=50 "
        f"output-dir='{run_dir}' overrides='{OVERRIDES}'"
    )
    assert inprocess.main(["--run-config", rc]) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: run failed: round 1 trained no client (all 3 sampled failed;")
    assert "RuntimeError: boom in fit" in err and "stopped after round 3" in err
    assert len(records(run_dir)) == 3
    failure = json.loads((run_dir / "failure.json").read_text())
    assert len(failure["rounds"]) == 3
    log = (run_dir / "client_errors.log").read_text()
    assert log.count("Traceback (most recent call last)") == 9 and 'broken.py", line' in log
    assert "Traceback" not in (run_dir / "metrics.jsonl").read_text()  # one line a failure there


def test_a_run_whose_rounds_all_time_out_stops_and_fails(small_npz, tmp_path):
    """No reply in any round (what fl.round_timeout=0.01 gives a real simulation): the run does
    not go on for num-server-rounds; it stops after fl.max_failed_rounds and fails."""

    def silent(ins, ctx, reply):
        return None if "arrays" in reply.content else reply

    rc = {
        "dataset": "npz",
        "data-path": str(small_npz),
        "num-server-rounds": 100000,
        "output-dir": str(tmp_path / "run"),
        "overrides": OVERRIDES + " fl.max_failed_rounds=2",
    }
    with pytest.raises(RunFailed, match="no reply within fl.round_timeout.*stopped after round 2"):
        run_in_process(rc, 6, silent)
    assert len(records(tmp_path / "run")) == 2

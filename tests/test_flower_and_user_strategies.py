"""Strategy choice (`strategy=`): Flower's strategies and a user's against the project's clients,
DMA as their weights, FedProx's proximal term on the client, checkpoints of their state."""

import json

import numpy as np
import pytest
import torch
from conftest import TINY, make_reply
from flwr.serverapp.strategy import FedAvg, Strategy
from localgrid import run_in_process

from fssl.checks import ConfigError
from fssl.instruction import Instruction
from fssl.methods import make_model, make_trainer
from fssl.methods.dma import dma_weights
from fssl.runtime import client_data_for, data_meta, dataset_for
from server_app.config import compose
from strategy import make_strategy
from strategy.flower import FLOWER, FlowerStrategy

K = 3
OVERRIDES = (
    "fl.num_clients=6 fl.fraction_train=0.5 dataset.num_labeled=100 train.local_epochs=1 "
    "train.tau=0.6 fl.node_wait=0 checkpoint.every=0 train.warmup_rounds=0 model.width=8"
)

pytestmark = pytest.mark.usefixtures("task_identity")


class RecordingStrategy(FedAvg):
    """A user's strategy, loaded by import path in the test below: FedAvg that records what it
    is given."""

    seen: list[dict] = []

    def __init__(self, tag: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.tag = tag

    def configure_train(self, server_round, arrays, config, grid):
        config["my-key"] = 7  # reaches the clients' instructions
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        RecordingStrategy.seen.append(
            {
                "round": server_round,
                "tag": self.tag,
                "metrics": sorted(
                    next(iter(r.content.metric_records.values())).keys() for r in replies
                )[0],
                "weights": [
                    next(iter(r.content.metric_records.values()))["num-examples"] for r in replies
                ],
            }
        )
        return super().aggregate_train(server_round, replies)


class Incomplete(Strategy):
    """No hooks implemented: loading it must fail before the first round."""


class Breaking(FedAvg):
    """A user's strategy whose aggregation raises in round 2."""

    def aggregate_train(self, server_round, replies):
        if server_round == 2:
            raise ValueError("boom in aggregate_train")
        return super().aggregate_train(server_round, replies)


def _rc(out, strategy, method="fixmatch", extra=""):
    return {
        "dataset": "npz",
        "method": method,
        "strategy": strategy,
        "num-server-rounds": 2,
        "seed": 1,
        "output-dir": str(out),
        "overrides": OVERRIDES + extra,
    }


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(FLOWER))
def test_every_flower_strategy_runs_two_rounds(name, small_npz, tmp_path):
    rc = _rc(tmp_path / name, name) | {"data-path": str(small_npz)}
    run_in_process(rc, 6)
    recs = _records(tmp_path / name)
    assert [r["round"] for r in recs] == [1, 2]
    last = recs[-1]
    assert last["strategy"]["name"] == name and len(last["clients"]) == 3
    assert np.isfinite(last["test_accuracy"])
    assert (tmp_path / name / "final_model.pt").is_file()


def test_custom_strategy_by_import_path(small_npz, tmp_path):
    RecordingStrategy.seen.clear()
    sent = []

    def hook(ins, ctx, reply):
        if "terms" in ins.content:
            sent.append(dict(ins.content["terms"]))
        return reply

    rc = _rc(
        tmp_path / "mine",
        "custom",
        "feddb",
        " strategy.target=test_flower_and_user_strategies:RecordingStrategy +strategy.params.tag=t1",
    )
    run_in_process(rc | {"data-path": str(small_npz)}, 6, hook)
    assert [s["round"] for s in RecordingStrategy.seen] == [1, 2]
    assert all(s["tag"] == "t1" for s in RecordingStrategy.seen)
    assert {"num-examples", "app_u", "train_loss", "num_labeled", "partition_id"} <= set(
        RecordingStrategy.seen[0]["metrics"]
    )
    # FedDB: the weights handed over are DMA's, the ones recorded for the round
    last = _records(tmp_path / "mine")[-1]
    assert np.allclose(
        RecordingStrategy.seen[-1]["weights"], [c["weight"] for c in last["clients"]]
    )
    assert sent and all(c.get("my-key") == 7 for c in sent)


@pytest.mark.parametrize(
    "target,match",
    [
        ("nowhere.module:Cls", "cannot import nowhere.module"),
        ("test_flower_and_user_strategies:Missing", "has no class Missing"),
        ("json:JSONDecoder", "not a subclass of flwr.serverapp.strategy.Strategy"),
        ("test_flower_and_user_strategies:Incomplete", "does not implement"),
        ("", "write a user.s class as"),
    ],
)
def test_bad_custom_strategy_is_refused_before_the_run(target, match):
    with pytest.raises(ConfigError, match=match):
        compose(["strategy=custom", f"strategy.target='{target}'"])


def test_methods_with_their_own_strategy_refuse_another():
    with pytest.raises(ConfigError, match="needs its own server side"):
        compose(["method=fedmatch", "strategy=fedadam"])
    with pytest.raises(ConfigError, match="server.robust.rule"):
        compose(["strategy=fedavg", "server.robust.rule=median"])


def _global():
    return {
        "w": np.array([1.0, 2.0], np.float32),
        "bn.running_mean": np.zeros(2, np.float32),
        "bn.num_batches_tracked": np.array(0, np.int64),
    }


def _reply(pid, w, app_u, node):
    arrays = {
        "w": np.array(w, np.float32),
        "bn.running_mean": np.full(2, float(pid), np.float32),
        "bn.num_batches_tracked": np.array(3, np.int64),
    }
    metrics = {
        "partition_id": pid,
        "num_labeled": 10,
        "num_unlabeled": 90,
        "train_loss": 1.0,
        "app_u": list(map(float, app_u)),
    }
    return make_reply(arrays, metrics, node)


APPS = [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.1, 0.1, 0.8]]


def _aggregate(s, replies, server_round=1):
    s.intake.bind_nodes({i: 20 + i for i in range(4)})
    s.global_arrays = _global()
    s.begin_round(server_round, [0, 1, 2, 3])
    return s.aggregate_train(server_round, replies)


def test_dma_composed_with_fedadam_gives_dmas_weights(monkeypatch):
    base = [
        "fl.num_clients=4",
        "fl.fraction_train=1.0",
        "method=feddb",
        "server.robust.clip=null",
        "train.warmup_rounds=0",
    ]
    replies = [_reply(i, [float(i), 0.0], a, 20 + i) for i, a in enumerate(APPS)]
    alone = make_strategy(compose([*base, "server.momentum=0"]), K)
    _aggregate(alone, replies)
    dma = np.array([c["weight"] for c in alone.round_record.clients])
    d = alone.cfg["dma"]
    assert np.allclose(
        dma,
        dma_weights(
            np.array(APPS), d["mode"], d["steps"], d["lr"], d["optimizer"], d["cap"]
        ).weights,
    )

    s = make_strategy(compose([*base, "strategy=fedadam"]), K)
    assert isinstance(s, FlowerStrategy)
    seen = []
    inner_avg = FedAvg.aggregate_train

    def spy(self, server_round, msgs):
        msgs = list(msgs)
        seen.append([m.content["metrics"]["num-examples"] for m in msgs])
        return inner_avg(self, server_round, msgs)

    monkeypatch.setattr(FedAvg, "aggregate_train", spy)
    s.inner.current_arrays = {"w": _global()["w"]}  # as its configure_train sets it
    arrays, _ = _aggregate(s, replies)
    w = np.array(seen[0])
    assert np.allclose(w / w.sum(), dma)  # FedAdam averaged with DMA's weights
    assert np.allclose([c["weight"] for c in s.round_record.clients], dma)
    out = arrays["w"].numpy()
    # FedAdam's first step on delta = sum beta_m w_m - w: m = 0.1 delta, v = 0.01 delta^2,
    # w + eta_norm m / (sqrt(v) + tau), eta_norm = 0.1 sqrt(1 - 0.99^2) / (1 - 0.9^2) (round 1)
    delta = dma @ np.array([[float(i), 0.0] for i in range(4)]) - np.array([1.0, 2.0])
    m, v = 0.1 * delta, 0.01 * delta**2
    eta = 0.1 * np.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    assert np.allclose(out, np.array([1.0, 2.0]) + eta * m / (np.sqrt(v) + 1e-3), atol=1e-5)
    # running statistics: averaged with the same weights; integer buffers: the largest
    assert np.allclose(arrays["bn.running_mean"].numpy(), dma @ np.arange(4), atol=1e-6)
    assert arrays["bn.num_batches_tracked"].numpy() == 3


def test_flower_fedavg_equals_the_weighted_average_without_momentum():
    cfg = [
        "fl.num_clients=4",
        "fl.fraction_train=1.0",
        "method=fixmatch",
        "server.momentum=0",
        "server.robust.clip=null",
        "server.weighting=samples",
    ]
    replies = [_reply(i, [float(i), 1.0], a, 20 + i) for i, a in enumerate(APPS)]
    ours, _ = _aggregate(make_strategy(compose(cfg), K), replies)
    flowers, _ = _aggregate(make_strategy(compose([*cfg, "strategy=fedavg"]), K), replies)
    for key in ("w", "bn.running_mean", "bn.num_batches_tracked"):
        assert np.allclose(ours[key].numpy(), flowers[key].numpy(), atol=1e-6)


def test_fedprox_sends_mu_and_the_term_changes_the_client_update(tmp_path):
    from flwr.app import Array, ArrayRecord, ConfigRecord

    s = make_strategy(
        compose(
            [
                "fl.num_clients=4",
                "fl.fraction_train=0.5",
                "method=fixmatch",
                "strategy=fedprox",
                "strategy.params.proximal_mu=0.5",
            ]
        ),
        K,
    )
    s.intake.bind_nodes({i: 20 + i for i in range(4)})
    msgs = list(
        s.configure_train(
            1, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), ConfigRecord(), None
        )
    )
    # a strategy's client terms travel as their own record, beside the instruction's config
    assert len(msgs) == 2 and all(m.content["terms"]["proximal-mu"] == 0.5 for m in msgs)
    assert all("proximal-mu" not in m.content["config"] for m in msgs)

    cfg = compose(TINY + ["method=fixmatch"])
    cfg["data_meta"] = meta = data_meta(dataset_for(cfg))
    data = client_data_for(cfg, 0, torch.device("cpu"))
    moved = []
    for mu in (0.0, 50.0):
        torch.manual_seed(0)
        model = make_model(cfg, meta["num_classes"], meta["channels"])
        start = [p.detach().clone() for p in model.parameters()]
        make_trainer(cfg, meta["mean"], meta["std"], torch.device("cpu")).fit(
            model, data, Instruction(0.05, seed=3, terms={"proximal-mu": mu})
        )
        moved.append(
            float(sum((p.detach() - q).square().sum() for p, q in zip(model.parameters(), start)))
        )
    assert moved[1] < 0.8 * moved[0]  # pulled back towards the received model


def test_flower_strategy_state_survives_a_checkpoint():
    cfg = compose(
        [
            "fl.num_clients=4",
            "fl.fraction_train=1.0",
            "method=fixmatch",
            "strategy=fedyogi",
            "server.robust.clip=null",
        ]
    )
    s = make_strategy(cfg, K)
    for r in (1, 2):
        s.inner.current_arrays = {"w": _global()["w"]}
        _aggregate(s, [_reply(i, [float(i + r), 0.0], a, 20 + i) for i, a in enumerate(APPS)], r)
    arrays, state = s.state()
    assert state["inner"]["m_t"] == "arrays" and not state["inner_unsaved"]
    fresh = make_strategy(cfg, K)
    fresh.load_state(arrays, json.loads(json.dumps(state)))
    for name in ("m_t", "v_t"):
        got, want = getattr(fresh.inner, name), getattr(s.inner, name)
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


def test_the_documented_example_strategy_runs(small_npz, tmp_path, monkeypatch):
    """docs/examples/my_strategy.py, as docs/strategies.md runs it (PYTHONPATH=docs/examples)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "docs" / "examples"))
    rc = _rc(
        tmp_path / "example",
        "custom",
        extra=" strategy.target=my_strategy:LabeledFedAvg +strategy.params.server_lr=0.8",
    ) | {"data-path": str(small_npz)}
    run_in_process(rc, 6)
    recs = _records(tmp_path / "example")
    assert [r["round"] for r in recs] == [1, 2] and recs[-1]["strategy"]["name"] == "custom"
    assert np.isfinite(recs[-1]["test_accuracy"])


def test_report_has_a_strategy_table_and_figure(small_npz, tmp_path):
    from feddb.report import main as report

    for strat in ("method", "fedavg", "fedprox"):
        for seed in (1, 2):
            rc = _rc(tmp_path / "runs" / strat / f"s{seed}", strat) | {
                "data-path": str(small_npz),
                "seed": seed,
            }
            run_in_process(rc, 6)
    assert report([str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "results.md").read_text()
    assert "### Strategies" in text and "| FedProx |" in text
    assert "FixMatch @ FedProx − FixMatch @ FedAvg | 2 |" in text
    assert (tmp_path / "rep" / "strategies.png").stat().st_size > 0


def test_a_strategy_that_raises_ends_the_run_naming_its_class_and_hook(small_npz, tmp_path):
    """Not a bad input (it raises mid-run): the run fails (exit 3 from the launchers) with one
    line naming the strategy's class and hook, the rounds before it recorded."""
    from server_app.rounds import RunFailed

    rc = _rc(
        tmp_path / "breaking",
        "custom",
        extra=" strategy.target=test_flower_and_user_strategies:Breaking",
    )
    with pytest.raises(
        RunFailed, match=r"strategy Breaking.aggregate_train raised ValueError: boom"
    ):
        run_in_process(rc | {"data-path": str(small_npz)}, 6)
    assert [r["round"] for r in _records(tmp_path / "breaking")] == [1]
    assert "Breaking.aggregate_train" in (tmp_path / "breaking" / "failure.json").read_text()


USER_WEIGHTING = '''
import numpy as np

from strategy.weighting import Weighting


class ByLabels(Weighting):
    """Each client by its labeled images alone."""

    def weights(self, replies, server_round):
        n_l = np.array([r["sizes"][0] for r in replies], dtype=np.float64)
        self.notes = {"by": "labels", "round": server_round}
        return n_l / n_l.sum()
'''


def test_a_users_weighting_policy_is_one_class_by_path(small_npz, tmp_path):
    """`server.weighting='<file>:Class'`: a Weighting subclass loaded as every user's class is
    (fssl/plugins.py) weighs each round; its notes are the round's record. A class that is not a
    Weighting is refused before the run."""
    (tmp_path / "my_weighting.py").write_text(USER_WEIGHTING)
    spec = f"{tmp_path / 'my_weighting.py'}:ByLabels"
    with pytest.raises(ConfigError, match="not a subclass of strategy.weighting.Weighting"):
        compose(["dma.enabled=false", f"server.weighting='{tmp_path / 'my_weighting.py'}:np'"])
    rc = _rc(tmp_path / "run", "method", extra=f" server.weighting='{spec}' server.momentum=0")
    run_in_process(rc | {"data-path": str(small_npz)}, 6)
    for r in _records(tmp_path / "run"):
        n_l = np.array([c["num_labeled"] for c in r["clients"]], dtype=np.float64)
        assert np.allclose([c["weight"] for c in r["clients"]], n_l / n_l.sum())
        assert r["dma"] == {"by": "labels", "round": r["round"]}

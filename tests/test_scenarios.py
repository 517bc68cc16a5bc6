"""The three federated semi-supervised scenarios: labels at the clients (the paper's), at the
server, and at some clients; where each method's pieces go in each, and what is refused."""

import json

import numpy as np
import pytest
import torch

from fssl.checks import ConfigError
from fssl.data import embedded_candidates
from fssl.instruction import Instruction
from fssl.partition import balanced_labeled_split, flower_partition, make_partition
from server_app.config import resolve


@pytest.fixture(scope="module")
def labels():
    return np.load(next(p for p in embedded_candidates() if p.is_file()))["y_train"].astype(
        np.int64
    )


def pools(labels, seed, num_labeled=100):
    return balanced_labeled_split(labels, num_labeled, 10, np.random.default_rng([seed, 2024]))


def test_labels_at_clients_is_the_papers_partition_unchanged(labels):
    a = make_partition(labels, 10, 100, 10, "dirichlet", 0.3, seed=4)
    b = make_partition(labels, 10, 100, 10, "dirichlet", 0.3, seed=4, scenario="labels_at_clients")
    assert all(
        np.array_equal(x, y) for x, y in zip(a.labeled + a.unlabeled, b.labeled + b.unlabeled)
    )
    assert len(a.server) == 0


@pytest.mark.parametrize("flower", [False, True])
def test_labels_at_server_keeps_every_label_on_the_server(labels, flower):
    if flower:
        part = flower_partition(
            labels,
            10,
            100,
            10,
            "ShardPartitioner",
            {"num_shards_per_partition": 2},
            2,
            scenario="labels_at_server",
        )
    else:
        part = make_partition(labels, 10, 100, 10, "dirichlet", 0.3, 2, scenario="labels_at_server")
    labeled_pool, unlabeled_pool = pools(labels, 2)
    assert np.array_equal(np.sort(part.server), labeled_pool)
    assert np.bincount(labels[part.server]).tolist() == [10] * 10
    assert all(len(lab) == 0 for lab in part.labeled)
    everyone = np.concatenate(part.unlabeled)
    assert len(everyone) == len(np.unique(everyone))
    assert not set(everyone) & set(part.server)  # no client ever holds a server image
    if not flower:
        assert sorted(everyone) == sorted(unlabeled_pool)


def test_labels_at_partial_clients_gives_all_labels_to_the_first_clients(labels):
    part = make_partition(
        labels,
        10,
        100,
        10,
        "iid",
        None,
        5,
        scenario="labels_at_partial_clients",
        labeled_clients=3,
    )
    labeled_pool, unlabeled_pool = pools(labels, 5)
    assert [len(lab) for lab in part.labeled] == [34, 33, 33] + [0] * 7
    for m in range(3):  # a labeled client holds its labeled images and nothing else
        assert np.array_equal(part.unlabeled[m], part.labeled[m])
    assert sorted(np.concatenate(part.labeled)) == sorted(labeled_pool)
    assert sorted(np.concatenate(part.unlabeled[3:])) == sorted(unlabeled_pool)
    assert len(part.server) == 0


@pytest.mark.parametrize(
    "run_config,match",
    [
        ({"scenario": "labels_everywhere"}, "unknown scenario 'labels_everywhere'"),
        (
            {"scenario": "labels_at_partial_clients", "overrides": "scenario.labeled_clients=20"},
            "`scenario.labeled_clients`: 20; allowed: an integer with 2 <= labeled_clients <= 19",
        ),
        (  # one labeled client: every labels-only round below fl.min_train_clients=2
            {"scenario": "labels_at_partial_clients", "overrides": "scenario.labeled_clients=1"},
            "`scenario.labeled_clients`: 1; allowed: an integer with 2 <= labeled_clients",
        ),
        (
            {
                "scenario": "labels_at_partial_clients",
                "overrides": "dp.mode=fixed server.momentum=0",
            },
            "labels-only rounds of labels_at_partial_clients train the 2 labeled clients alone",
        ),
        (
            {"scenario": "labels_at_partial_clients", "method": "fixmatch", "strategy": "qfedavg"},
            "in scenario labels_at_partial_clients clients hold none",
        ),
        (
            {"scenario": "labels_at_server", "overrides": "fl.fraction_evaluate=0.2"},
            "in scenario labels_at_server",
        ),
        (
            {"scenario": "labels_at_server", "method": "fixmatch", "strategy": "qfedavg"},
            "strategy=qfedavg weighs each client by its loss on its labels",
        ),
        (
            {"scenario": "labels_at_clients", "overrides": "scenario.server_epochs=3"},
            "scenario.server_epochs=3 applies to scenario labels_at_server only, and this run's "
            "is labels_at_clients \\(method feddb\\)",
        ),
        (
            {"scenario": "labels_at_server", "overrides": "scenario.labeled_clients=3"},
            "scenario.labeled_clients=3 applies to scenario labels_at_partial_clients only",
        ),
        (
            {"method": "semifl", "overrides": "model.norm=bn"},
            "method semifl in scenario labels_at_clients: method.static_bn recomputes BatchNorm",
        ),
        (
            {"scenario": "labels_at_server", "method": "fixmatch", "num-server-rounds": 5},
            "method fixmatch in scenario labels_at_server: train.warmup_rounds=10 >= num_rounds=5",
        ),
    ],
)
def test_combinations_that_make_no_sense_are_refused(run_config, match):
    with pytest.raises(ConfigError, match=match):
        resolve(run_config)


def client(n_l, n_u, seed=0):
    from fssl.train import ClientData

    g = torch.Generator().manual_seed(seed)
    x_l = torch.randint(0, 255, (n_l, 1, 28, 28), generator=g, dtype=torch.uint8)
    x_u = torch.randint(0, 255, (n_u, 1, 28, 28), generator=g, dtype=torch.uint8)
    return ClientData(x_l, torch.arange(n_l) % 10, x_u, torch.arange(n_u) % 10)


def trainer_and_model(overrides, method="fixmatch"):
    from fssl.methods import make_model, make_trainer

    cfg, _ = resolve({"method": method, "overrides": overrides})
    cfg["data_meta"] = {"num_classes": 10, "channels": 1, "image_shape": [1, 28, 28]}
    torch.manual_seed(0)
    model = make_model(cfg, 10, 1)
    return make_trainer(cfg, (0.5,), (0.25,), torch.device("cpu")), model


def test_a_client_without_labels_learns_from_pseudo_labels_alone():
    trainer, model = trainer_and_model("train.tau=0.05 train.mode=fullbatch train.local_epochs=1")
    before = [p.detach().clone() for p in model.parameters()]
    m = trainer.fit(model, client(0, 64), Instruction(0.1, seed=1))
    assert m["num_labeled"] == 0 and m["loss_sup"] == 0.0
    assert m["pseudo_label_ratio"] > 0 and m["loss_unsup"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # no confident pseudo-label, no label: nothing to learn, the model is left as it came
    trainer, model = trainer_and_model("train.tau=1.0 train.mode=fullbatch train.local_epochs=1")
    before = [p.detach().clone() for p in model.parameters()]
    trainer.fit(model, client(0, 64), Instruction(0.1, seed=1))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_labeled_client_of_partial_clients_trains_on_its_labels_alone():
    trainer, model = trainer_and_model(
        "scenario=labels_at_partial_clients train.tau=0.05 train.mode=fullbatch"
    )
    m = trainer.fit(model, client(20, 20), Instruction(0.1, seed=1))
    assert m["loss_sup"] > 0 and m["loss_unsup"] == 0.0 and "pseudo_label_ratio" not in m
    trainer, model = trainer_and_model("train.tau=0.05 train.mode=fullbatch")  # the paper's
    m = trainer.fit(model, client(20, 20), Instruction(0.1, seed=1))
    assert m["loss_unsup"] > 0


def strategy_for(overrides, method="fixmatch", sizes=None):
    from strategy import ServerSetup, make_strategy

    cfg, _ = resolve({"method": method, "overrides": overrides})
    cfg["data_meta"] = {"num_classes": 10, "channels": 1, "image_shape": [1, 28, 28]}
    return make_strategy(cfg, 10, ServerSetup(partition_sizes=sizes))


@pytest.mark.parametrize("method", ["fedavg", "fixmatch"])
def test_rounds_sample_only_clients_with_something_to_learn(method):
    sizes = [(50, 50), (50, 50), (0, 900), (0, 900), (0, 900), (0, 900)]
    base = "fl.num_clients=6 fl.fraction_train=0.5 train.warmup_rounds=2"
    s = strategy_for(f"{base} scenario=labels_at_partial_clients", method, sizes)
    for t in (1, 2):  # warm-up: labels only, so the labeled clients only
        assert s.sampler.sample(t, 0.5) == [0, 1]
    later = {p for t in range(3, 30) for p in s.sampler.sample(t, 0.5)}
    assert later == ({0, 1} if method == "fedavg" else set(range(6)))
    s = strategy_for(f"{base} scenario=labels_at_server", method, [(0, 900)] * 6)
    assert s.sampler.sample(1, 0.5) == [] and (s.sampler.sample(3, 0.5) == []) == (
        method == "fedavg"
    )
    # labels at the clients: the draw is the one it always was
    s = strategy_for(base, method, [(10, 90)] * 6)
    rng = np.random.default_rng([0, 5, 7])
    assert s.sampler.sample(5, 0.5) == sorted(int(i) for i in rng.choice(6, 3, replace=False))


def test_a_labeled_client_of_partial_clients_weighs_its_labels_once():
    """Its unlabeled set is its labeled images again (for APP-U); it trains on its labels alone,
    so n_m = n_l, not n_l + n_u."""
    sizes = [(50, 50), (50, 50), (0, 900), (0, 900)]
    s = strategy_for(
        "fl.num_clients=4 train.warmup_rounds=1 server.weighting=samples "
        "scenario=labels_at_partial_clients",
        "fixmatch",
        sizes,
    )
    parsed = [
        {"metrics": {"partition_id": pid}, "sizes": (n_l, n_u)}
        for pid, (n_l, n_u) in ((0, sizes[0]), (2, sizes[2]))
    ]
    assert np.allclose(s.coefficients(2, parsed), [50 / 950, 900 / 950])
    assert np.allclose(s.coefficients(1, parsed), [1.0, 0.0])  # warm-up: labels only


@pytest.mark.parametrize("method", ["semifl", "fixmatch"])
def test_a_semifl_client_with_no_confident_pseudo_label_sits_the_round_out(method):
    """SemiFL's official code leaves such a client out of the update; here it keeps no weight and
    the others share it. Other methods weigh every reply as before."""
    s = strategy_for(
        "scenario=labels_at_server train.warmup_rounds=1 server.weighting=uniform "
        "server.warmup_weighting=uniform",
        method,
        [(0, 900)] * 3,
    )
    parsed = [
        {"metrics": {"partition_id": i, "num_labeled": 0, "pseudo_label_count": c}}
        for i, c in enumerate((0, 30, 10))
    ]
    w = np.full(3, 1 / 3)
    got = s.coefficients(2, parsed)
    assert np.allclose(got, [0, 0.5, 0.5] if method == "semifl" else w)
    assert np.allclose(s.coefficients(1, parsed), w)  # warm-up: labels only
    for p in parsed:
        p["metrics"]["pseudo_label_count"] = 0
    assert np.allclose(s.coefficients(2, parsed), 0 if method == "semifl" else w)


def arrays(value, keys=("a.weight", "b.bias")):
    return {k: np.full(3, value, dtype=np.float32) for k in keys}


def test_fedrgd_groups_average_with_the_servers_model_when_it_has_labels():
    s = strategy_for(
        "scenario=labels_at_server server.momentum=0 method.groups=2", "fedrgd", [(0, 900)] * 4
    )
    assert s.server_step == "parallel"  # the weight the clients leave goes to w_s
    coefficients = np.full(4, 1 / 3 / 2 * 2 / 2)  # two groups of two: each client 2/3 / 2 / 2
    replies = [{"arrays": arrays(3.0)}] * 4
    new = s.update(arrays(0.0), replies, coefficients, s.round_record, residual=arrays(6.0))
    # w = sum_k c_k w_k + (1 - sum c) w_s = 2/3 * 3 + 1/3 * 6
    assert np.allclose(new["a.weight"], 4.0)
    # labels at the clients: the global model stands in for w_s
    assert np.allclose(
        s.update(arrays(0.0), replies, coefficients, s.round_record)["a.weight"], 2.0
    )


def test_fedmatchs_server_trains_sigma_on_its_labels_and_leaves_psi():
    """FedMatch's labels-at-server variant: the server's step (after aggregation, before the
    model goes out, as the official code's train_global_model() opens each round) moves the
    sigma side on its labels and holds every psi."""
    from fssl.methods import fedmatch
    from fssl.runtime import dataset_for, partition_for
    from fssl.server_train import ServerLabels

    cfg, _ = resolve(
        {
            "method": "fedmatch",
            "scenario": "labels_at_server",
            "overrides": "dataset.num_labeled=40 train.local_steps=2 train.batch_size=8",
        }
    )
    server = ServerLabels(cfg, dataset_for(cfg), partition_for(cfg), torch.device("cpu"))
    assert server.size == 40
    before = {k: v.clone() for k, v in server.model.state_dict().items()}
    after = server.train(1, before)
    moved = {k: not torch.equal(before[k], after[k]) for k in before if "running" not in k}
    assert not any(m for k, m in moved.items() if fedmatch.is_psi(k))
    assert any(m for k, m in moved.items() if not fedmatch.is_psi(k))


def test_static_batchnorm_is_the_statistics_of_the_servers_images():
    from fssl.server_train import static_batchnorm

    bn = torch.nn.BatchNorm2d(1, momentum=0.1)
    model = torch.nn.Sequential(bn)
    x = torch.randint(0, 255, (40, 1, 4, 4), dtype=torch.uint8)
    assert static_batchnorm(model, x, (0.0,), (1.0,), batch_size=40) == 1
    xf = x.float() / 255
    assert torch.allclose(bn.running_mean, xf.mean().reshape(1), atol=1e-6)
    assert torch.allclose(bn.running_var, xf.var().reshape(1), atol=1e-5)
    assert bn.momentum == 0.1  # the layer's own momentum is back for the clients


TINY = (
    "fl.num_clients=8 fl.fraction_train=0.25 dataset.num_labeled=40 train.mode=minibatch "
    "train.local_steps=2 train.batch_size=8 train.mu=2 train.warmup_rounds=1 train.tau=0.5 "
    "dataset.val_size=0 logging.tensorboard=false eval.every=2"
)


def run_scenario(tmp_path, method, scenario, extra=""):
    from localgrid import run_in_process

    out = tmp_path / f"{method}-{scenario}"
    run_in_process(
        {
            "method": method,
            "scenario": scenario,
            "num-server-rounds": 2,
            "output-dir": str(out),
            "overrides": f"{TINY} {extra}",
        },
        8,
    )
    return out, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("scenario", ["labels_at_server", "labels_at_partial_clients"])
@pytest.mark.parametrize("method", ["fedavg", "fixmatch", "feddb", "semifl", "fedrgd", "fedmatch"])
def test_each_method_runs_in_each_scenario(tmp_path, method, scenario):
    native = method == "semifl" and scenario == "labels_at_server"  # SemiFL as published
    out, rounds = run_scenario(tmp_path, method, scenario, "model.norm=bn" if native else "")
    if native:
        check_static_batchnorm(out)
    assert [r["round"] for r in rounds] == [1, 2]
    assert 0 < rounds[-1]["test_accuracy"] <= 1
    labeled = {0, 1} if scenario == "labels_at_partial_clients" else set()
    warmup = {c["partition_id"] for c in rounds[0]["clients"]}
    assert warmup <= labeled  # warm-up: labels only
    trained = {c["partition_id"] for c in rounds[1]["clients"]}
    if method == "fedavg":
        assert trained <= labeled
    else:
        assert len(trained) == 2
    summary = json.loads((out / "partition_summary.json").read_text())
    assert sum(summary["server"]) == (40 if scenario == "labels_at_server" else 0)
    if scenario == "labels_at_server":  # timed as its own, also when it trains beside the clients
        assert all(
            r["timing"]["server_train"] > 0.01 and r["timing"]["configure"] >= 0 for r in rounds
        )


def check_static_batchnorm(run_dir):
    """The model the clients receive and the server evaluates carries BatchNorm statistics of the
    server's labeled images (recomputing them on the final model changes nothing)."""
    import copy

    import yaml

    from fssl.methods import make_model
    from fssl.runtime import dataset_for, partition_for
    from fssl.server_train import static_batchnorm
    from fssl.train import to_nchw

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    ds = dataset_for(cfg)
    model = make_model(cfg, 10, 1)
    model.load_state_dict(torch.load(run_dir / "final_model.pt"))
    again = copy.deepcopy(model)
    x = to_nchw(ds.x_train[partition_for(cfg).server], torch.device("cpu"))
    assert static_batchnorm(again, x, tuple(ds.mean), tuple(ds.std), 250) > 0
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        if name.endswith(("running_mean", "running_var")):
            assert torch.allclose(a, b, atol=1e-5), name


def test_semifl_clients_without_labels_train_fix_and_mix_losses_alone():
    trainer, model = trainer_and_model("train.tau=0.05 train.mode=fullbatch", "semifl")
    m = trainer.fit(model, client(0, 64), Instruction(0.1, seed=1))
    assert m["loss_sup"] == 0.0 and m["loss_unsup"] > 0 and m["pseudo_label_ratio"] > 0
    trainer, model = trainer_and_model("train.tau=0.05 train.mode=fullbatch", "semifl")
    m = trainer.fit(
        model, client(20, 64), Instruction(0.1, seed=1)
    )  # the adaptation: CE on labels too
    assert m["loss_sup"] > 0


class StubServer:
    """Marks a model as the server's: every array + 100."""

    def train(self, server_round, state):
        return {k: v + 100 for k, v in state.items()}


@pytest.mark.parametrize(
    "method,after", [("semifl", "alternate"), ("fedmatch", "alternate"), ("fedrgd", "parallel")]
)
def test_the_server_trains_after_aggregation_or_beside_the_clients(method, after):
    from flwr.app import ArrayRecord

    from server_app.rounds import RoundLoop

    s = strategy_for("scenario=labels_at_server", method, [(0, 900)] * 4)
    assert s.server_step == after
    loop = RoundLoop(s, grid=None, server=StubServer())
    start = ArrayRecord({"w": torch.zeros(2)})
    aggregate = ArrayRecord({"w": torch.ones(2)})
    loop.server_model = loop.server_train(1, start)  # what push_train does in parallel
    got = loop.after_aggregate(1, aggregate, start).to_torch_state_dict()["w"]
    # alternate (SemiFL, FedMatch): the server fine-tunes the aggregate; parallel (FedRGD): the
    # strategy has already combined the server's model with the clients'
    assert torch.equal(got, torch.full((2,), 101.0 if after == "alternate" else 1.0))
    # a round no client joined (labels-only or warm-up): the server's model, either way
    none = loop.after_aggregate(1, None, start).to_torch_state_dict()["w"]
    assert torch.equal(none, torch.full((2,), 100.0))


def test_differential_privacy_skips_rounds_no_client_joins(tmp_path):
    """Flower's adaptive-clipping wrapper divides by the number of replies: a round of the
    server's alone never reaches it."""
    from localgrid import run_in_process

    out = tmp_path / "run"
    run_in_process(
        {
            "method": "fixmatch",
            "scenario": "labels_at_server",
            "num-server-rounds": 2,
            "output-dir": str(out),
            "overrides": f"{TINY} dp.mode=adaptive dp.noise_multiplier=0.1 server.momentum=0",
        },
        8,
    )
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [len(r["clients"]) for r in rounds] == [0, 2]


def test_a_flower_strategy_runs_rounds_no_client_joins(tmp_path):
    """Labels-only FedAvg under Flower's FedAvgM in labels_at_server: no round sends anything
    (Flower's node sampling would wait for nodes for ever), the server trains alone."""
    from localgrid import run_in_process

    out = tmp_path / "run"
    run_in_process(
        {
            "method": "fedavg",
            "strategy": "fedavgm",
            "scenario": "labels_at_server",
            "num-server-rounds": 2,
            "output-dir": str(out),
            "overrides": TINY,
        },
        8,
    )
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients"] for r in rounds] == [[], []] and rounds[-1]["test_accuracy"] > 0.1


def test_the_report_gives_each_scenario_its_own_tables():
    from feddb.report import paired, partition_order, placed_partition, setting, variant

    cfgs = [
        resolve({"scenario": s, "partition": p})[0]
        for s in ("labels_at_partial_clients", "labels_at_server", "labels_at_clients")
        for p in ("dir0.3", "iid")
    ]
    parts = [placed_partition(c) for c in cfgs]
    assert partition_order(parts) == [
        "IID",
        "IID/labels-at-server",
        "IID/labels-at-partial-clients",
        "δ=0.3",
        "δ=0.3/labels-at-server",
        "δ=0.3/labels-at-partial-clients",
    ]
    assert setting(cfgs[2]) == "mnist10k δ=0.3/labels-at-server"
    # SemiFL as published (BatchNorm, static BN) is a row of its own beside the GroupNorm SemiFL
    native = resolve(
        {"method": "semifl", "scenario": "labels_at_server", "overrides": "model.norm=bn"}
    )
    adapted = resolve({"method": "semifl", "scenario": "labels_at_server"})
    assert [variant(native[0]), variant(adapted[0])] == ["SemiFL (static BN)", "SemiFL"]
    runs = [
        {"setting": "s", "variant": v, "seed": seed, "final": acc + seed / 100, "collapsed": False}
        # what pairing reads (fssl/pairing.py): one seed, no warm-up, no provenance
        | {"cfg": {"seed": seed, "train": {"warmup_rounds": 0}}, "rounds": []}
        for v, acc in (("FedAvg", 0.90), ("SemiFL", 0.93), ("SemiFL (static BN)", 0.95))
        for seed in (0, 1, 2)
    ]
    got = {(p["a"], p["b"]): round(p["mean"], 6) for p in paired(runs)}
    assert (
        got[("SemiFL (static BN)", "FedAvg")] == 5.0
        and got[("SemiFL (static BN)", "SemiFL")] == 2.0
    )


def test_the_loss_check_tests_the_model_the_update_makes():
    """FedRGD in labels_at_server leaves weight on the server's model: the loss check's candidate
    averages put it there too."""
    from strategy.robust import loss_check

    seen = []

    def loss(arrays):
        seen.append(float(arrays["w"][0]))
        return 1.0

    clients = [{"w": np.full(2, 3.0)}, {"w": np.full(2, 3.0)}, {"w": np.full(2, 3.0)}]
    weights = np.full(3, 0.2)  # 0.4 left to the residual
    loss_check({"w": np.zeros(2)}, clients, weights, loss, 0.02, [0], 1, {"w": np.full(2, 10.0)})
    assert seen and all(abs(v - (0.6 * 3 + 0.4 * 10)) < 1e-9 for v in seen)
    seen.clear()
    loss_check({"w": np.zeros(2)}, clients, weights, loss, 0.02, [0], 1)
    assert all(abs(v - 0.6 * 3) < 1e-9 for v in seen)


def test_labels_at_partial_clients_trains_the_labeled_clients_alone_in_the_warm_up(
    tmp_path, small_npz
):
    """Through the real ServerApp and ClientApp: two fully labeled clients train alone in the
    warm-up, then every client joins; no client holds both kinds of data."""
    from feddb.inprocess import run_in_process

    out = tmp_path / "run"
    run_in_process(
        {
            "dataset": "npz",
            "data-path": str(small_npz),
            "method": "feddb",
            "scenario": "labels_at_partial_clients",
            "num-server-rounds": 2,
            "seed": 3,
            "output-dir": str(out),
            # one warm-up round on 200 labels: a low threshold, so that some are confident
            "overrides": "fl.num_clients=4 fl.fraction_train=1.0 dataset.num_labeled=200 "
            "train.local_epochs=2 train.tau=0.2 train.warmup_rounds=1 dataset.val_size=200 "
            "model.width=8",
        }
    )
    first, second = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(c["partition_id"] for c in first["clients"]) == [0, 1]
    assert sorted(c["partition_id"] for c in second["clients"]) == [0, 1, 2, 3]
    for c in second["clients"]:
        labeled = c["partition_id"] < 2
        assert (c["num_labeled"] > 0) == labeled and (c["pseudo_label_ratio"] == 0) == labeled
    hist = json.loads((out / "partition_summary.json").read_text())
    assert sum(hist["server"]) == 0 and [sum(h) for h in hist["labeled"]][2:] == [0, 0]


def check_partial_clients_rounds(method: str, rounds: list[dict]) -> None:
    """What two rounds of RSCFed or CBAFed (a warm-up round, then one of their own) must show,
    whatever launched them (`feddb local`, a sweep, `flwr run`: tests/test_sweep_and_report.py,
    tests/test_flwr_run_simulation.py): RSCFed trains the union of its subsets after the warm-up
    and weighs them by distance; CBAFed's thresholds come from the warm-up's labels, and clients
    weigh by their kept labels."""
    assert [r["round"] for r in rounds] == [1, 2] and 0 < rounds[-1]["test_accuracy"] <= 1
    assert {c["partition_id"] for c in rounds[0]["clients"]} <= {0, 1}
    if method == "cbafed":
        assert len(rounds[0]["method_notes"]["thresholds"]) == 10
        for c in rounds[1]["clients"]:
            assert (c["weight"] == 0) == (
                c["num_labeled"] == 0 and not any(c["pseudo_label_histogram"])
            )
        return
    subsets = rounds[1]["method_notes"]["subsets"]
    trained = {c["partition_id"] for c in rounds[1]["clients"]}
    assert trained == {p for s in subsets for p in s["clients"]} and len(subsets) == 3
    assert np.isclose(sum(c["weight"] for c in rounds[1]["clients"]), 1.0)

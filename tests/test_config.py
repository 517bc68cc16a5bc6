import pytest

import fssl.config as rules
from fssl.checks import ConfigError
from fssl.config import compose_from_run_config, group_options, run_config_to_overrides
from fssl.methods import discover
from server_app.config import compose, resolve


def test_defaults_are_the_quick_feddb_run():
    cfg = compose()
    assert cfg["method"]["name"] == "feddb" and cfg["dpl"] is True and cfg["dma"]["enabled"]
    assert cfg["dataset"]["name"] == "mnist10k" and cfg["model"]["name"] == "cnn"
    assert cfg["partition"] == {
        "mode": "dirichlet",
        "delta": 0.3,
        "min_size": 1,
        "imbalance_ratio": None,
        "pool_order": "index",
    }
    assert cfg["train"]["tau"] == 0.95 and cfg["dma"]["steps"] == 100 and cfg["dma"]["lr"] == 1.0


def test_run_config_keys_are_declared_once_typed_with_confs_defaults():
    """pyproject.toml declares the keys Flower takes; each maps to conf/, and its default is
    conf/'s own, so `flwr run .` with no options runs conf/'s default run."""
    import yaml

    from fssl.checks import GROUPS, RUN_CONFIG_TARGETS
    from fssl.config import CONF_DIR, run_config_defaults
    from fssl.identity import IDENTITY_KEYS

    defaults = run_config_defaults()
    assert set(defaults) == set(RUN_CONFIG_TARGETS) | {"overrides", "resume", *IDENTITY_KEYS}
    conf = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    chosen = {k: v for d in conf["defaults"] if isinstance(d, dict) for k, v in d.items()}
    assert {g: defaults[g] for g in GROUPS} == {g: chosen[g] for g in GROUPS}
    assert defaults["seed"] == conf["seed"] and isinstance(defaults["num-server-rounds"], int)
    assert run_config_to_overrides(defaults) == []
    assert compose_from_run_config(defaults)["num_rounds"] == 40  # quick's


def test_a_key_at_its_default_keeps_the_presets_value_and_a_given_one_wins():
    from fssl.config import run_config_defaults

    d = run_config_defaults()
    miniature = compose_from_run_config(d | {"experiment": "miniature"})
    assert miniature["num_rounds"] == 80
    assert (
        compose_from_run_config(d | {"experiment": "miniature", "num-server-rounds": 3})[
            "num_rounds"
        ]
        == 3
    )
    fixmatch = compose_from_run_config(d | {"method": "fixmatch"})
    assert fixmatch["dpl"] is False and fixmatch["dma"]["enabled"] is False
    assert compose_from_run_config(d | {"method": "fixmatch", "dpl": True})["dpl"] is True
    with pytest.raises(ConfigError, match="unknown run-config key.*'num-rounds'"):
        compose_from_run_config(d | {"num-rounds": 3})


def test_run_config_keys_map_to_hydra():
    rc = {
        "method": "fixmatch",
        "dpl": True,
        "dma": "",
        "dataset": "",
        "num-server-rounds": 5,
        "seed": 1,
        "output-dir": "runs/try1",
        "overrides": "train.lr=0.05 dma.steps=50",
    }
    cfg = compose_from_run_config(rc)
    assert cfg["method"]["name"] == "fixmatch" and cfg["dpl"] is True
    assert cfg["dma"]["enabled"] is False  # fixmatch's default kept
    assert cfg["num_rounds"] == 5 and cfg["seed"] == 1 and cfg["output_dir"] == "runs/try1"
    assert cfg["train"]["lr"] == 0.05 and cfg["dma"]["steps"] == 50
    assert run_config_to_overrides({"data-path": "/a=b"}) == ["dataset.path='/a=b'"]


@pytest.mark.parametrize(
    "name",
    [
        f"paper/{d}_{p}"
        for d in ("cifar10", "svhn", "cifar100")
        for p in ("iid", "dir0.3", "dir0.1")
    ],
)
def test_paper_presets(name):
    cfg = compose([f"experiment={name}"])
    ds, part = name.split("/")[1].split("_")
    assert cfg["dataset"]["name"] == ds and cfg["model"]["name"] == "wrn28_2"
    assert cfg["num_rounds"] == 800 and cfg["fl"]["num_clients"] == 100
    assert cfg["fl"]["fraction_train"] == 0.1 and cfg["train"]["lr"] == 0.03
    assert cfg["partition"]["delta"] == {"iid": None, "dir0.3": 0.3, "dir0.1": 0.1}[part]
    expected = {"cifar10": 4000, "cifar100": 10000, "svhn": 1000 if part == "iid" else 4000}
    assert cfg["dataset"]["num_labeled"] == expected[ds]
    assert group_options("experiment").count(name) == 1
    # the paper's protocol: full-batch E = 5, tau 0.95, batch-statistics BN, uniform weights, no
    # validation split, Algorithm 2's APP-U as printed
    assert (cfg["train"]["mode"], cfg["train"]["local_epochs"], cfg["train"]["tau"]) == (
        "fullbatch",
        5,
        0.95,
    )
    assert cfg["model"]["norm"] == "batchstat" and cfg["server"]["weighting"] == "uniform"
    assert cfg["dataset"]["val_size"] == 0 and cfg["app_u"]["estimate"] == "literal"
    assert cfg["train"]["warmup_rounds"] == 0 and cfg["dma"]["enabled"] is True


@pytest.mark.parametrize(
    "rc,match",
    [
        (
            {"method": "fedbogus"},
            "unknown method 'fedbogus': choose one of " + ", ".join(group_options("method")),
        ),
        (
            {"dataset": "imagenet"},
            "unknown dataset 'imagenet': choose one of cifar10, cifar100, "
            "hf, imagefolder, mnist10k, npz, svhn",
        ),
        ({"partition": "dir0.5"}, "unknown partition 'dir0.5'"),
        ({"overrides": "train.tau=1.5"}, "`train.tau`: 1.5; allowed: a number with 0 < tau <= 1"),
        ({"overrides": "train.tau=0"}, "`train.tau`: 0"),
        ({"overrides": "partition.delta=-0.3"}, "`partition.delta`: -0.3; allowed: a number > 0"),
        ({"overrides": "fl.fraction_train=1.5"}, "`fl.fraction_train`: 1.5"),
        ({"overrides": "eval.threads=0"}, "`eval.threads`: 0; allowed: auto, or an integer >= 1"),
        ({"overrides": "eval.every=0"}, "`eval.every`: 0; allowed: an integer >= 1"),
        ({"num-server-rounds": -1}, "num-server-rounds (`num_rounds`): -1"),
        (
            {"overrides": "fl.always_sample=[25]"},
            "`fl.always_sample`: [25]; allowed: a list of "
            "integers x with 0 <= x < 20 (partition ids, e.g. [0]; 20 = fl.num_clients)",
        ),
        ({"overrides": "dma.mode=adam"}, "`dma.mode`: 'adam'; allowed: softmax, literal, exact"),
        ({"overrides": "train.nosuchkey=1"}, "unknown key `train.nosuchkey` in overrides"),
        ({"overrides": "+train.nosuchkey=1"}, "adds `train.nosuchkey`, a key the configuration"),
        (
            {"overrides": "train.local_epochs=2.5"},
            "`train.local_epochs`: 2.5; allowed: an integer >= 0",
        ),
        (
            {"overrides": "train.nesterov=maybe"},
            "`train.nesterov`: 'maybe'; allowed: true or false",
        ),
        (
            {"overrides": "dataset.std=[0.3,-1]"},
            "`dataset.std`: [0.3, -1]; allowed: a non-empty "
            "list of numbers > 0 (one per channel), or null",
        ),
        ({"overrides": "model.norm=ln"}, "`model.norm`: 'ln'; allowed: batchstat, bn, gn"),
        ({"overrides": "seed=abc"}, "`seed`: 'abc'; allowed: an integer"),
        ({"overrides": "checkpoint.every=-1"}, "`checkpoint.every`: -1; allowed: an integer >= 0"),
        ({"overrides": "fl.num_clients=true"}, "`fl.num_clients`: True; allowed: an integer >= 1"),
        (
            {"overrides": "dma.cap=0.5"},
            "`dma.cap`: 0.5; allowed: a number >= 1 (each weight <= "
            "cap/m), or null (unbounded DMA)",
        ),
        (
            {"overrides": "dp.mode=fixed server.momentum=0.5"},
            "`server.momentum`: 0.5; allowed: 0 with dp.mode on (noise is added after the server update",
        ),
        (
            {"method": "fedrgd", "overrides": "method.groups=0"},
            "`method.groups`: 0; allowed: an integer >= 1",
        ),
        ({"method": "semifl", "overrides": "method.mix_alpha=-1"}, "`method.mix_alpha`: -1"),
        (
            {"method": "fedmatch", "overrides": "method.view=strong"},
            "`method.view`: 'strong'; allowed: raw, weak",
        ),
        (
            {"overrides": "method.trainer=nosuch"},
            "`method.trainer`: 'nosuch'; allowed: " + ", ".join(sorted(discover())),
        ),
        ({"overrides": "method.pseudo_labels=sometimes"}, "`method.pseudo_labels`: 'sometimes'"),
        (
            {"overrides": "train.precision=fp16"},
            "`train.precision`: 'fp16'; allowed: auto, fp32, bf16",
        ),
        ({"overrides": "train.optimizer_state=disk"}, "`train.optimizer_state`: 'disk'"),
        ({"overrides": "logging.tensorboard=maybe"}, "`logging.tensorboard`: 'maybe'"),
        (
            {"overrides": "server.robust.min_cosine=2"},
            "`server.robust.min_cosine`: 2; allowed: a number with -1 <= min_cosine <= 1, or null",
        ),
        (
            {"overrides": "server.robust.min_cosine_margin=-0.1"},
            "`server.robust.min_cosine_margin`: -0.1; allowed: a number with 0 <= min_cosine_margin "
            "<= 2, or null",
        ),
        (
            {"overrides": "server.robust.scope=never"},
            "`server.robust.scope`: 'never'; allowed: deployment, always",
        ),
        (
            {"overrides": "+server.robust.loss_check_scope=always"},
            "server.robust.loss_check_scope is gone: server.robust.scope",
        ),
        (
            {"overrides": "app_u.estimate=final"},
            "`app_u.estimate`: 'final'; allowed: local, literal",
        ),
        ({"overrides": "partition.imbalance_ratio=0.5"}, "`partition.imbalance_ratio`: 0.5"),
        (
            {"overrides": "partition.pool_order=random"},
            "`partition.pool_order`: 'random'; allowed: index, class",
        ),
        (
            {"overrides": "server.robust.loss_check_scale=step"},
            "`server.robust.loss_check_scale`: 'step'; allowed: lr, none",
        ),
    ],
)
def test_bad_values_are_named_with_what_is_allowed(rc, match):
    with pytest.raises(
        ConfigError,
        match=match.replace("(", "\\(")
        .replace(")", "\\)")
        .replace("[", "\\[")
        .replace(".", "\\.")
        .replace("*", "\\*"),
    ):
        resolve(rc)


@pytest.mark.parametrize(
    "rule,how,value,allowed",
    [
        ("integer", {}, 1.0, "an integer"),
        ("integer", {}, True, "an integer"),  # a bool is not an integer
        ("integer", {"low": 1}, 0, "an integer >= 1"),
        ("integer", {"low": 0}, -1, "an integer >= 0"),
        ("number", {}, float("nan"), "a number"),
        ("number", {"low": 0, "open_low": True}, 0, "a number > 0"),
        ("number", {"high": 1, "open_high": True}, 1, "a number < 1"),
        ("number", {"low": 0, "high": 1, "open_low": True}, 0, "a number with 0 < key <= 1"),
        ("number", {"low": 0, "high": 0.5, "open_high": True}, 0.5, "a number with 0 <= key < 0.5"),
        ("number", {"low": -1, "high": 1}, 1.5, "a number with -1 <= key <= 1"),
        (
            "number",
            {"low": 0, "high": 1, "open_low": True, "open_high": True},
            1,
            "a number with 0 < key < 1",
        ),
        ("choice", {"options": ("fullbatch", "minibatch")}, "batch", "fullbatch, minibatch"),
        ("choice", {"options": ("auto", True, False)}, "on", "auto, true, false"),
        ("boolean", {}, "maybe", "true or false"),
        ("boolean", {}, 1, "true or false"),
        ("path_string", {}, 3, "a path string"),
        ("mapping", {"nullable": True}, [1], "a mapping, or null"),
        ("number", {"low": 1, "nullable": True}, 0, "a number >= 1, or null"),
        ("integer", {"low": 1, "nullable": "all"}, 0, "an integer >= 1, or null (all)"),
        (
            "number",
            {"low": 1, "note": "(x the median)", "nullable": True},
            0.5,
            "a number >= 1 (x the median), or null",
        ),
        ("integer", {"low": 1, "also": ("auto",)}, "0", "auto, or an integer >= 1"),
        (
            "integers",
            {"low": 0, "high": 4, "open_high": True},
            [4],
            "a list of integers x with 0 <= x < 4",
        ),
        (
            "numbers",
            {"low": 0, "open_low": True, "nonempty": True},
            [],
            "a non-empty list of numbers > 0",
        ),
    ],
)
def test_each_rule_words_what_it_allows(rule, how, value, allowed):
    with pytest.raises(ConfigError) as err:
        getattr(rules, rule)({"a": {"key": value}}, "a.key", **how)
    assert str(err.value) == f"invalid value for `a.key`: {value!r}; allowed: {allowed}"


def test_a_rule_takes_what_it_says_and_reads_an_absent_key_as_its_default():
    cfg = {"a": {"zero": 0, "one": 1, "none": None, "auto": "auto", "flag": False}}
    assert rules.number(cfg, "a.zero", "a.one", low=0, high=1) == (0, 1)  # closed ends
    assert rules.integer(cfg, "a.one", low=1) == 1
    assert rules.number(cfg, "a.none", low=1, nullable=True) is None
    assert rules.integer(cfg, "a.auto", low=1, also=("auto",)) == "auto"
    assert rules.boolean(cfg, "a.flag") is False
    assert rules.choice(cfg, "a.absent", ("lr", "none"), default="lr") == "lr"
    assert rules.integers(cfg, "a.absent", low=0, default=[]) == []
    with pytest.raises(KeyError):  # no default: the key is required
        rules.integer(cfg, "a.absent")
    with pytest.raises(ConfigError, match="`a.absent`: None"):  # default None: absent reads null
        rules.integer(cfg, "a.absent", low=1, default=None)


def test_every_defence_is_in_scope_on_supernodes_and_off_in_simulations_by_default():
    from fssl.config import apply_defence_scope
    from server_app.config import compose

    cfg = compose()
    assert apply_defence_scope(cfg, untrusted_nodes=True) == []  # SuperNodes: all kept
    assert cfg["server"]["robust"]["clip"] == 4.0 and cfg["dma"]["cap"] == 2.0
    sim = compose()
    off = apply_defence_scope(sim, untrusted_nodes=False)
    assert off == [
        "server.robust.clip",
        "server.robust.min_cosine",
        "server.robust.loss_check",
        "dma.cap",
    ]
    rb = sim["server"]["robust"]
    assert (rb["clip"], rb["min_cosine"], rb["loss_check"], sim["dma"]["cap"]) == (None,) * 4
    always = compose(["server.robust.scope=always"])
    assert apply_defence_scope(always, untrusted_nodes=False) == []
    assert always["server"]["robust"]["min_cosine"] == -0.1


def test_the_paper_presets_run_without_any_defence_where_nodes_are_simulated():
    from fssl.config import apply_defence_scope
    from server_app.config import compose

    cfg = compose(["experiment=paper/cifar10_dir0.3"])
    apply_defence_scope(cfg, untrusted_nodes=False)
    rb = cfg["server"]["robust"]
    assert (rb["clip"], rb["min_cosine"], rb["loss_check"], cfg["dma"]["cap"]) == (None,) * 4


def test_the_server_takes_one_cpu_thread_unless_it_has_the_machine(monkeypatch):
    """Flower's simulation grid: the clients busy every core while the server evaluates; the
    in-process runner: one thread a process (the rule, fssl.runtime.cpu_threads); a deployed
    ServerApp has its machine: every core. OMP_NUM_THREADS, where set, wins."""
    import os

    import torch
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    from feddb.inprocess import LocalGrid
    from server_app.app import server_threads
    from server_app.nodes import simulated

    flower = object.__new__(InMemoryGrid)  # Flower's simulation grid
    local = object.__new__(LocalGrid)  # the in-process runner: sequential
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert server_threads("auto", flower, cpu) == 1
    assert server_threads("auto", local, cpu) == 1
    assert server_threads("auto", object(), cpu) == len(os.sched_getaffinity(0))  # deployed
    assert server_threads("auto", flower, cuda) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert server_threads("auto", flower, cpu) == 2
    assert server_threads(3, flower, cpu) == 3
    # both are simulations (the defences stay off); any other grid has SuperNodes
    assert simulated(flower) and simulated(local) and not simulated(object())

"""Methods are classes registered by name: the framework never branches on a method's name, DPL
composes with every pseudo-labelling method, and DPL's global prior is the aggregate's APP-U."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, make_reply

from fssl.losses import debias
from fssl.methods import discover, make_trainer
from fssl.runtime import data_meta, dataset_for
from server_app.config import compose
from strategy import contract, make_strategy

PROJECT = Path(__file__).resolve().parents[1]
FRAMEWORK = ["strategy", "server_app", "client_app", "fssl"]


def cfg_for(method, *extra):
    cfg = compose(TINY + [f"method={method}", *extra])
    cfg["data_meta"] = data_meta(dataset_for(cfg))
    return cfg


def trainer_for(method, *extra):
    cfg = cfg_for(method, *extra)
    t = make_trainer(cfg, cfg["data_meta"]["mean"], cfg["data_meta"]["std"], torch.device("cpu"))
    t.load_client_state({})
    return cfg, t


def test_no_framework_code_names_a_method():
    names = sorted(discover())
    assert {"supervised", "fixmatch", "semifl", "fedmatch", "fedrgd"} <= set(names)
    literal = re.compile(r"""["']({})["']""".format("|".join(names)))
    found = []
    for top in FRAMEWORK:
        for path in (PROJECT / top).rglob("*.py"):
            if "methods" in path.relative_to(PROJECT).parts:
                continue  # the methods' own modules
            found += [
                f"{path.relative_to(PROJECT)}: {m}" for m in literal.findall(path.read_text())
            ]
    assert not found, found


def test_every_method_has_a_yaml_and_a_display_name():
    for name, cls in discover().items():
        assert cls.display and cls.registered_name == name
        yamls = [
            p
            for p in (PROJECT / "conf" / "method").glob("*.yaml")
            if f"trainer: {name}" in p.read_text()
        ]
        assert yamls, f"no conf/method/*.yaml uses {name}"


@pytest.mark.parametrize("method", ["fixmatch", "semifl"])
def test_dpl_composes_with_every_pseudo_labelling_method(method):
    _, t = trainer_for(method, "dpl=true")
    probs = torch.tensor([[0.5, 0.4, 0.1], [0.2, 0.5, 0.3], [0.6, 0.2, 0.2], [0.3, 0.3, 0.4]])
    prior = torch.tensor([0.7, 0.2, 0.1])
    labels, _ = t.pseudo_labels(probs, prior, torch.arange(4))
    assert labels.tolist() == debias(probs, prior).argmax(1).tolist() != probs.argmax(1).tolist()


def test_dpl_global_prior_is_the_aggregate_app_u_sent_with_the_model():
    cfg = cfg_for(
        "fixmatch", "dpl=true", "dpl_prior=global", "server.momentum=0", "server.weighting=uniform"
    )
    s = make_strategy(cfg, 10)
    from flwr.app import ConfigRecord

    assert contract.GLOBAL_PRIOR not in s.round_config(1, ConfigRecord())  # nothing aggregated yet
    glob = {"w": np.zeros(2, np.float32)}
    s.global_arrays = glob
    s.begin_round(1, [])
    apps = {1: np.eye(10)[0] * 0.5 + 0.05, 2: np.full(10, 0.1)}

    def metrics(pid):
        return {
            "partition_id": pid,
            "num_labeled": 5,
            "num_unlabeled": 50,
            "app_u": apps[pid].tolist(),
        }

    s.aggregate_train(1, [make_reply(glob, metrics(p), node=p) for p in apps])
    sent = s.round_config(2, ConfigRecord())[contract.GLOBAL_PRIOR]
    assert np.allclose(sent, (apps[1] + apps[2]) / 2)
    _, t = trainer_for("fixmatch", "dpl=true", "dpl_prior=global")
    t.global_prior = torch.tensor(sent, dtype=torch.float32)
    assert torch.equal(t.debias_prior(torch.full((10,), 0.1)), t.global_prior)
    _, local = trainer_for("fixmatch", "dpl=true")
    assert torch.equal(local.debias_prior(torch.full((10,), 0.1)), torch.full((10,), 0.1))

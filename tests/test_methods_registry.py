"""Methods are classes registered by name: the framework never branches on a method's name, each
new method's rule is its paper's (hand-computed cases), DPL composes with every one, what a client
keeps survives between its rounds, and DPL's global prior is the aggregate's APP-U."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, make_reply

from fssl.instruction import Instruction
from fssl.methods import discover, make_model, make_trainer
from fssl.methods.dpl import debias
from fssl.methods.estimates import SLOT
from fssl.runtime import client_data_for, data_meta, dataset_for
from fssl.train import ClientData
from server_app.config import compose
from strategy import make_strategy

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


def start_every_estimate(t):
    """A client's estimates for three classes and four unlabeled images, whichever it keeps."""
    uniform = torch.full((3,), 1 / 3)
    initial = {"q_hat": uniform, "p_model": uniform, "label_hist": uniform}
    initial |= {"time_p": torch.tensor([1 / 3]), "selected": torch.full((4,), -1)}
    t.estimates.start(**{name: initial[name] for name in t.keeps})


def test_no_framework_code_names_a_method():
    names = sorted(discover())
    assert {"supervised", "fixmatch", "semifl", "fedmatch", "fedrgd"} <= set(names)
    # "feddb" is also the project's name (MLflow's experiment, W&B's project): not a method's
    literal = re.compile(r"""["']({})["']""".format("|".join(n for n in names if n != "feddb")))
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


def test_flexmatch_thresholds_follow_each_class_learning_effect_and_mask_before_update():
    _, t = trainer_for("flexmatch", "train.tau=0.9")
    t.estimates["selected"] = torch.tensor([0, 0, 0, 1, -1, -1])
    # unused 2, sigma (3, 1, 0): beta = sigma / max(3, 2); T = beta / (2 - beta) * tau
    assert torch.allclose(t.thresholds(3), torch.tensor([0.9, 0.18, 0.0]))
    probs = torch.tensor([[0.1, 0.8, 0.1], [0.95, 0.03, 0.02], [0.1, 0.1, 0.8]])
    labels, mask = t.select(probs, torch.tensor([4, 5, 3]), learn=True)
    assert labels.tolist() == [1, 0, 2] and mask.tolist() == [True, True, True]
    assert t.estimates["selected"].tolist() == [
        0,
        0,
        0,
        1,
        -1,
        0,
    ]  # only image 5 was confident (0.95 >= 0.9)
    t.cfg["method"]["threshold_warmup"] = False  # normalised by the largest class alone
    assert torch.allclose(t.thresholds(3), torch.tensor([0.9, 1 / 7 * 0.9, 0.0]))


def test_freematch_thresholds_are_emas_of_confidence_and_its_fairness_term_is_the_authors():
    _, t = trainer_for("freematch", "method.ema=0.9")
    start_every_estimate(t)
    probs = torch.tensor([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1]])
    labels, mask = t.select(probs, torch.tensor([0, 1]), learn=True)
    tau = 0.9 / 3 + 0.1 * 0.75
    p_model = 0.9 / 3 + 0.1 * probs.mean(0)
    assert float(t.estimates["time_p"]) == pytest.approx(tau)
    assert torch.allclose(t.estimates["p_model"], p_model)
    assert torch.allclose(t.estimates["label_hist"], 0.9 / 3 + 0.1 * torch.tensor([1.0, 0, 0]))
    scaled = p_model / p_model.max()
    assert mask.tolist() == [bool(tau * scaled[0] <= 0.9), bool(tau * scaled[0] <= 0.6)]
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    p = torch.softmax(logits, 1)
    hist = torch.tensor([0.5, 0.5, 0.0])
    a = t.estimates["p_model"] / t.estimates["label_hist"]
    a = a / a.sum()
    b = p.mean(0) * torch.tensor([2.0, 2.0, 0.0])
    b = b / b.sum()
    assert hist.sum() == 1
    assert float(t.fairness(logits)) == pytest.approx(float((a * torch.log(b + 1e-12)).sum()))


def test_debiaspl_labels_are_logit_adjusted_by_its_running_mean_prediction():
    _, t = trainer_for("debiaspl", "method.ema=0.5", "train.tau=0.5")
    t.estimates["q_hat"] = torch.tensor([0.6, 0.3, 0.1])
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    labels, mask = t.select(probs, torch.tensor([0, 1]), learn=True)
    q = probs / torch.tensor([0.6, 0.3, 0.1]).sqrt()  # softmax(f - 0.5 log q) = norm(p / q^0.5)
    q = q / q.sum(1, keepdim=True)
    assert (
        labels.tolist() == q.argmax(1).tolist() and mask.tolist() == (q.max(1)[0] >= 0.5).tolist()
    )
    assert torch.allclose(
        t.estimates["q_hat"], 0.5 * torch.tensor([0.6, 0.3, 0.1]) + 0.5 * probs.mean(0)
    )
    logits, target = torch.zeros(2, 3), torch.tensor([0, 2])
    margin = 0.5 * torch.tensor([0.6, 0.3, 0.1]).log()  # the q-hat the labels were made with
    expected = torch.nn.functional.cross_entropy(logits + margin, target)
    assert float(t.unlabeled_loss(logits, target, torch.ones(2), 2.0)) == pytest.approx(
        float(expected)
    )


@pytest.mark.parametrize("method", ["fixmatch", "flexmatch", "freematch", "debiaspl", "semifl"])
def test_dpl_composes_with_every_pseudo_labelling_method(method):
    _, t = trainer_for(method, "dpl=true")
    start_every_estimate(t)
    probs = torch.tensor([[0.5, 0.4, 0.1], [0.2, 0.5, 0.3], [0.6, 0.2, 0.2], [0.3, 0.3, 0.4]])
    prior = torch.tensor([0.7, 0.2, 0.1])
    labels, _ = t.pseudo_labels(probs, prior, torch.arange(4))
    assert labels.tolist() == debias(probs, prior).argmax(1).tolist() != probs.argmax(1).tolist()


@pytest.mark.parametrize("method", ["flexmatch", "freematch", "debiaspl"])
def test_what_a_client_keeps_comes_back_in_its_next_round(method):
    slot = SLOT
    cfg = cfg_for(method, "train.tau=0.1")
    meta, cpu = cfg["data_meta"], torch.device("cpu")
    full = client_data_for(cfg, 1, cpu)  # its labels and 64 of its unlabeled images
    data = ClientData(full.x_l, full.y_l, full.x_u[:64], full.y_u[:64])
    t = make_trainer(cfg, meta["mean"], meta["std"], cpu)
    t.fit(make_model(cfg, 10, 1), data, Instruction(0.1, seed=1))
    kept = t.client_state()[slot]
    again = make_trainer(cfg, meta["mean"], meta["std"], cpu)
    again.fit(make_model(cfg, 10, 1), data, Instruction(0.1, seed=2), {slot: kept})
    after = again.client_state()[slot]
    fresh = make_trainer(cfg, meta["mean"], meta["std"], cpu)
    fresh.fit(make_model(cfg, 10, 1), data, Instruction(0.1, seed=2))
    assert any(not torch.equal(after[k], fresh.client_state()[slot][k]) for k in after)


def test_dpl_global_prior_is_the_aggregate_app_u_sent_with_the_model():
    cfg = cfg_for(
        "fixmatch", "dpl=true", "dpl_prior=global", "server.momentum=0", "server.weighting=uniform"
    )
    s = make_strategy(cfg, 10)
    from flwr.app import MessageType

    assert s.instruction(1, 1, MessageType.TRAIN).global_prior is None  # nothing aggregated yet
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
    sent = s.instruction(2, 1, MessageType.TRAIN).global_prior
    assert np.allclose(sent, (apps[1] + apps[2]) / 2)
    _, t = trainer_for("fixmatch", "dpl=true", "dpl_prior=global")
    t.global_prior = torch.tensor(sent, dtype=torch.float32)
    assert torch.equal(t.debias_prior(torch.full((10,), 0.1)), t.global_prior)
    _, local = trainer_for("fixmatch", "dpl=true")
    assert torch.equal(local.debias_prior(torch.full((10,), 0.1)), torch.full((10,), 0.1))

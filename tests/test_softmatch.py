"""SoftMatch (fssl/methods/softmatch.py) is its paper's rule as USB implements it: hard labels from
the probabilities as they come, the truncated Gaussian weight of the aligned confidence, EMAs of
its mean and variance updated before the batch's weights, uniform alignment by the EMA of the
model's own mean prediction (from the first batch's mean)."""

import math

import pytest
import torch
from conftest import TINY

from fssl.instruction import Instruction
from fssl.methods import make_trainer, method_class
from fssl.runtime import data_meta, dataset_for
from server_app.config import compose


def softmatch(*extra):
    cfg = compose(TINY + ["method=softmatch", *extra])
    cfg["data_meta"] = meta = data_meta(dataset_for(cfg))
    t = make_trainer(cfg, meta["mean"], meta["std"], torch.device("cpu"))
    t.load_client_state({})
    k = 10
    t.estimates.start(mu=torch.tensor(0.5), var=torch.tensor(0.04), p_hat=torch.full((k,), 1.0 / k))
    return t


def test_the_preset_is_the_papers_method_with_online_labels():
    cfg = compose(["method=softmatch"])
    m = cfg["method"]
    assert m["trainer"] == "softmatch" and m["pseudo_labels"] == "online"
    assert (m["ema"], m["n_sigma"], m["dpl"], m["dma"]) == (0.97, 2.0, False, False)
    assert method_class("softmatch").display == "SoftMatch"


def test_the_weight_is_a_truncated_gaussian_of_the_aligned_confidence():
    t = softmatch()
    probs = torch.full((2, 10), 0.0)
    probs[0, 3], probs[0, 4] = 0.9, 0.1  # confident: above mu, weight 1
    probs[1, 7], probs[1, 2] = 0.3, 0.7 / 9 * 9  # max 0.7 at class 2
    probs[1] = probs[1] / probs[1].sum()
    labels, weights = t.select(probs, None, learn=False)
    conf = probs.max(1).values
    expected = torch.exp(-((conf - 0.5).clamp(max=0) ** 2) / (2 * 0.04 / 2.0**2))
    assert labels.tolist() == [3, 2] and torch.allclose(weights, expected)
    assert weights[0] == 1.0 and weights.dtype == torch.float32


def test_uniform_alignment_sets_the_weights_and_not_the_labels():
    """USB: the label is the argmax of the probabilities as they come; the weight comes from the
    aligned ones, which divide by the model's mean prediction p-hat."""
    t = softmatch()
    t.estimates["p_hat"] = torch.tensor([0.4] + [0.6 / 9] * 9)
    probs = torch.tensor([[0.6, 0.4] + [0.0] * 8])
    labels, weights = t.select(probs, None, learn=False)
    assert labels.item() == 0  # not aligned
    aligned = probs / t.estimates["p_hat"]
    conf = (aligned / aligned.sum()).max()  # class 1's 0.4 / (0.6/9) outweighs class 0's 0.6 / 0.4
    assert torch.allclose(weights, torch.exp(-((conf - 0.5).clamp(max=0) ** 2) / (2 * 0.04 / 4)))


def test_p_hat_starts_at_a_new_clients_first_batch_mean():
    t = softmatch()
    del t.estimates.values["p_hat"]
    probs = torch.softmax(torch.randn(4, 10, generator=torch.Generator().manual_seed(2)), 1)
    t.select(probs, torch.arange(4), learn=False)  # the metrics pass: no alignment, no update
    assert "p_hat" not in t.estimates
    t.select(probs, torch.arange(4), learn=True)
    assert torch.allclose(t.estimates["p_hat"], probs.mean(0))


def test_learning_updates_p_hat_from_raw_probabilities_then_mu_and_var_before_the_weights():
    t = softmatch()
    m = 0.97
    raw = torch.softmax(torch.randn(6, 10, generator=torch.Generator().manual_seed(1)), 1)
    debiased = raw.flip(1)  # what DPL would hand over: select's `probs`
    p_hat = m * torch.full((10,), 0.1) + (1 - m) * raw.mean(0)
    aligned = debiased / p_hat
    aligned = aligned / aligned.sum(1, keepdim=True)
    conf = aligned.max(1).values
    mu = m * 0.5 + (1 - m) * conf.mean()
    var = m * 0.04 + (1 - m) * conf.var(unbiased=True)
    labels, weights = t.select(debiased, torch.arange(6), learn=True, raw=raw)
    assert torch.equal(labels, debiased.argmax(1))
    s = t.estimates
    assert torch.allclose(s["p_hat"], p_hat) and torch.allclose(s["mu"], mu)
    assert torch.allclose(s["var"], var)
    spread = 2 * var / 4.0
    assert torch.allclose(weights, torch.exp(-((conf - mu).clamp(max=0) ** 2) / spread))
    assert t.client_metrics() == pytest.approx({"mu": float(mu), "var": float(var)})
    kept = t.client_state()["estimates"]
    assert set(kept) == {"mu", "var", "p_hat"} and math.isclose(float(kept["mu"]), float(mu))


def test_a_client_round_trains_with_soft_weights_and_reports_mu_and_var():
    from fssl.methods import make_model
    from fssl.runtime import client_data_for

    cfg = compose(TINY + ["method=softmatch", "train.warmup_rounds=0", "dpl=true"])
    cfg["data_meta"] = meta = data_meta(dataset_for(cfg))
    t = make_trainer(cfg, meta["mean"], meta["std"], torch.device("cpu"))
    torch.manual_seed(0)
    out = t.fit(
        make_model(cfg, 10, 1), client_data_for(cfg, 1, torch.device("cpu")), Instruction(0.1, 3)
    )
    assert set(out["method"]) == {"mu", "var"} and 0 < out["method"]["mu"] <= 1
    assert 0 < out["pseudo_label_ratio"] <= 1 and out["loss_unsup"] > 0


def test_a_clientapp_round_stores_its_state_and_replies_with_mu_and_var():
    """Through the ClientApp: its state (two scalars and a vector) goes into Flower's
    context.state without an error, and mu and var travel in the reply."""
    from test_client_app import _run

    cfg = compose(TINY + ["method=softmatch", "train.warmup_rounds=0"])
    _, reply = _run(cfg)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert {"method:mu", "method:var"} <= set(reply.content["metrics"])

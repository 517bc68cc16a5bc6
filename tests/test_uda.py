"""UDA (fssl/methods/uda.py) is its paper's rule with USB's defaults and loss: soft targets, the
weak view's prediction sharpened with T = 0.4, kept where its unsharpened max reaches 0.8, and the
soft cross-entropy on strong views averaged over the batch; DPL divides the distribution before
it is sharpened, and UDA runs with DPL and DMA."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY

from fssl.checks import ConfigError
from fssl.methods import make_trainer, method_class
from fssl.methods.dpl import debias
from fssl.runtime import client_data_for, data_meta, dataset_for
from server_app.config import compose

CPU = torch.device("cpu")


def uda(*extra):
    cfg = compose(TINY + ["method=uda", "train.tau=0.8", *extra])  # TINY's tau is 0.5
    cfg["data_meta"] = meta = data_meta(dataset_for(cfg))
    t = make_trainer(cfg, meta["mean"], meta["std"], CPU)
    t.load_client_state({})
    return t


@pytest.mark.parametrize("experiment", ["quick", "miniature"])
def test_the_preset_is_usbs_uda_with_online_targets(experiment):
    cfg = compose(["method=uda", f"experiment={experiment}"])
    m = cfg["method"]
    assert (m["trainer"], m["pseudo_labels"], m["temperature"]) == ("uda", "online", 0.4)
    assert (cfg["train"]["tau"], cfg["train"]["lambda_u"], m["dpl"], m["dma"]) == (
        0.8,
        1.0,
        False,
        False,
    )
    assert cfg["train"]["unlabeled_loss_norm"] == "all"  # USB's mean over the batch
    assert method_class("uda").display == "UDA"


def test_targets_are_sharpened_and_the_mask_is_of_the_unsharpened_max():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.85, 0.1, 0.05]])
    targets, mask = uda().select(probs, torch.arange(2), learn=True)
    # p^(1/0.4) renormalised, by hand: 0.7^2.5 = 0.409963, 0.2^2.5 = 0.017889, 0.1^2.5 = 0.003162
    expected = torch.tensor([[0.9511598, 0.0415034, 0.0073368], [0.9944444, 0.0047210, 0.0008346]])
    assert torch.allclose(targets, expected, atol=1e-6)
    assert mask.tolist() == [False, True]  # row 0 sharpens to 0.95 and is still left out


def test_one_online_step_is_usbs_unsupervised_loss():
    """The step's loss from its weak and strong logits, as USB's train_step: mask from the
    weak probabilities (p_cutoff), targets softmax(logits_w / T), `ce_loss` with soft targets
    times the mask, mean over the batch."""
    t = uda("train.mode=minibatch")
    t.gen = torch.Generator().manual_seed(0)
    data = client_data_for(t.cfg, 1, CPU)
    idx = torch.arange(6)
    _, rows, loss_fn = t.unlabeled_batch(None, data, idx, torch.full((10,), 0.1))
    logits = 3 * torch.randn(12, 10, generator=torch.Generator().manual_seed(1))
    lw, ls = logits[:6], logits[6:]
    mask = (F.softmax(lw, 1).max(1).values >= 0.8).float()
    pseudo = F.softmax(lw / 0.4, 1)
    usb = (torch.sum(-pseudo * F.log_softmax(ls, 1), 1) * mask).mean()
    assert 0 < mask.sum() < 6 and rows == 12  # some rows in, some out
    assert float(loss_fn(logits)) == pytest.approx(float(usb), rel=1e-5)


def test_dpl_divides_the_distribution_before_it_is_sharpened():
    t = uda("dpl=true")
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.85, 0.05]])
    prior = torch.tensor([0.6, 0.2, 0.2])
    targets, mask = t.pseudo_labels(probs, prior, torch.arange(2), learn=True)
    debiased = debias(probs, prior)  # row 0 becomes (1/3, 1/2, 1/6): class 1 now leads
    sharpened = debiased**2.5 / (debiased**2.5).sum(1, keepdim=True)
    assert torch.allclose(targets, sharpened) and targets[0].argmax() == 1
    assert mask.tolist() == (debiased.max(1).values >= 0.8).tolist() == [False, True]


def test_uda_trains_with_dpl_and_dma_in_the_in_process_engine(tmp_path):
    from feddb.inprocess import main as local_main

    out = tmp_path / "run"
    rc = (
        "method='uda' dpl=true dma=true num-server-rounds=2 "
        f"output-dir='{out}' overrides='{' '.join(TINY)} train.warmup_rounds=0 train.tau=0.1 "
        "train.local_epochs=1 train.local_steps=2'"  # tau 0.1: an untrained model's targets count
    )
    assert local_main(["--run-config", rc]) == 0
    rounds = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2] and rounds[1]["dma"]
    for r in rounds:  # soft targets trained in both rounds: the figures count them
        assert r["pseudo_label_ratio"] > 0
        assert all(c["loss_unsup"] > 0 for c in r["clients"])


def test_a_temperature_that_cannot_sharpen_is_refused():
    with pytest.raises(ConfigError, match="method.temperature"):
        compose(["method=uda", "method.temperature=0"])

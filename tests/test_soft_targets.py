"""Soft targets and the pseudo-label figures: `select` may return per-image distributions (N x K)
as well as hard labels, checked once and named when wrong; the unlabeled loss takes them (soft
cross-entropy) with the rows' image indices; the figures come from the targets the steps trained
on, online or once a round, in both modes and both forward passes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY

from fssl.checks import ConfigError
from fssl.instruction import Instruction
from fssl.methods import make_model, method_class
from fssl.methods.fixmatch import FixMatch
from fssl.runtime import data_meta, dataset_for
from fssl.train import ClientData
from server_app.config import compose

CPU = torch.device("cpu")
K = 10


class EvenOnly(FixMatch):
    """Keeps exactly the even-indexed images: uniform soft targets (their mass on the true class
    is 1/K whatever it is) or argmax labels. Its loss checks the rows' indices it is given."""

    soft = True

    def select(self, probs, idx, learn, raw=None):
        mask = idx % 2 == 0
        if self.soft:
            return torch.full_like(probs, 1.0 / probs.shape[1]), mask
        return probs.argmax(1), mask

    def unlabeled_loss(self, logits, target, mask, denom, idx=None):
        kept = idx % 2 == 0
        assert bool((kept if mask is None else (mask > 0) == kept).all())
        assert target.dim() == (2 if self.soft else 1) and len(target) == len(idx)
        return super().unlabeled_loss(logits, target, mask, denom, idx)


def synthetic(n_u: int = 64, n_l: int = 16) -> ClientData:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n_u + n_l, 1, 28, 28), generator=g, dtype=torch.uint8)
    classes = torch.arange(n_u + n_l) % K
    return ClientData(images[n_u:], classes[n_u:], images[:n_u], classes[:n_u])


def trainer_for(*extra: str, soft: bool = True) -> EvenOnly:
    cfg = compose(
        [
            *TINY,
            "method=fixmatch",
            "train.local_steps=2",
            "train.batch_size=16",
            "model.width=8",
            *extra,
        ]
    )
    cfg["data_meta"] = data_meta(dataset_for(cfg))
    t = EvenOnly(cfg, cfg["data_meta"]["mean"], cfg["data_meta"]["std"], CPU)
    t.soft = soft
    return t


@pytest.mark.parametrize(
    "labels,mode,forward,soft,rows",
    [  # rows: those the figures count (online: each step's; round: each image once)
        ("online", "minibatch", "joint", True, 2 * 2 * 32),  # 2 epochs of 2 steps of 32
        ("online", "fullbatch", "separate", False, 2 * 64),
        ("round", "minibatch", "separate", False, 64),
        ("round", "fullbatch", "joint", True, 64),  # the kept rows only, mask None
    ],
)
def test_the_figures_are_those_of_the_targets_training_used(labels, mode, forward, soft, rows):
    modes = [f"method.pseudo_labels={labels}", f"train.mode={mode}", f"train.forward={forward}"]
    t = trainer_for(*modes, "train.mu=2", soft=soft)
    torch.manual_seed(0)
    out = t.fit(make_model(t.cfg, K, 1), synthetic(), Instruction(0.05, seed=3, lambda_u=1.0))
    assert out["pseudo_label_ratio"] == 0.5 and out["pseudo_label_count"] == rows // 2
    assert sum(out["pseudo_label_histogram"]) == rows // 2 and out["loss_unsup"] > 0
    assert sum(out["pseudo_label_class_true"]) == rows // 2  # the kept rows by true class
    if soft:  # a distribution's accuracy is its mass on the true class; its class its argmax
        assert out["pseudo_label_accuracy"] == pytest.approx(1 / K)
        assert out["pseudo_label_histogram"][0] == rows // 2


def test_a_warm_up_round_makes_no_targets_and_reports_no_figures():
    t = trainer_for("method.pseudo_labels=online", "train.mu=2")
    out = t.fit(make_model(t.cfg, K, 1), synthetic(), Instruction(0.05, seed=3, lambda_u=0.0))
    assert "pseudo_label_ratio" not in out and out["loss_unsup"] == 0.0


def test_soft_cross_entropy_on_one_hot_targets_is_the_hard_one():
    t = trainer_for()
    logits, labels = torch.randn(6, K), torch.tensor([0, 3, 3, 9, 1, 2])
    mask = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.0])
    hard = FixMatch.unlabeled_loss(t, logits, labels, mask, 4.0)
    soft = FixMatch.unlabeled_loss(t, logits, F.one_hot(labels, K).float(), mask, 4.0)
    assert float(soft) == pytest.approx(float(hard))


def test_dpl_divides_the_distribution_before_select_sees_it():
    t = trainer_for("dpl=true")
    seen = {}

    def select(probs, idx, learn, raw=None):
        seen["probs"], seen["raw"] = probs, raw
        return probs, probs.max(1).values > 0.5

    t.select = select
    probs = torch.tensor([[0.6, 0.4] + [0.0] * 8, [0.5, 0.5] + [0.0] * 8])
    prior = torch.tensor([0.8, 0.2] + [1e-3] * 8)
    targets, _ = t.pseudo_labels(probs, prior, torch.arange(2))
    assert torch.equal(seen["raw"], probs) and float(targets[0, 1]) > float(targets[0, 0])


@pytest.mark.parametrize(
    "targets,mask,error",
    [
        (torch.full((4, K), 0.2), torch.ones(4, dtype=torch.bool), "rows summing|sum to 1"),
        (torch.full((4, K + 1), 0.1), torch.ones(4, dtype=torch.bool), "N x 10 float"),
        (torch.zeros(4, dtype=torch.int32), torch.ones(4, dtype=torch.bool), "hard labels"),
        (torch.zeros(4, dtype=torch.long), torch.full((4,), 1.5), "outside \\[0, 1\\]"),
        (torch.zeros(4, dtype=torch.long), torch.ones(3, dtype=torch.bool), "for 4 images"),
    ],
)
def test_what_select_returns_is_checked_and_the_class_named(targets, mask, error):
    t = trainer_for()
    t.select = lambda probs, idx, learn, raw=None: (targets, mask)
    with pytest.raises((TypeError, ValueError), match=f"^EvenOnly.select returned .*({error})"):
        t.pseudo_labels(torch.full((4, K), 0.1), torch.full((K,), 0.1), torch.arange(4))


def test_an_unlabeled_loss_without_idx_is_refused_saying_how_to_write_it(tmp_path):
    (tmp_path / "old.py").write_text(
        "from fssl.methods.fixmatch import FixMatch\n\n\n"
        "class Old(FixMatch):\n"
        "    def unlabeled_loss(self, logits, target, mask, denom):\n"
        "        return super().unlabeled_loss(logits, target, mask, denom)\n"
    )
    with pytest.raises(ConfigError, match=r"Old.unlabeled_loss takes no `idx`.*denom, idx=None\)"):
        method_class(f"{tmp_path / 'old.py'}:Old")

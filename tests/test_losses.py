import torch

from fssl.losses import app_u, masked_ce, momentum_update, pseudo_label
from fssl.methods.dpl import debias


def test_app_u_reduces_over_samples_not_to_a_scalar():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
    p = app_u(probs)
    assert p.shape == (3,)
    assert torch.allclose(p, torch.tensor([0.4, 0.5, 0.1]))


def test_debias_is_prior_division_and_equals_logit_adjustment():
    logits = torch.randn(50, 10, generator=torch.Generator().manual_seed(0))
    probs = logits.softmax(1)
    prior = app_u(probs)
    expected = (logits - prior.log()).softmax(1)
    assert torch.allclose(debias(probs, prior), expected, atol=1e-6)
    # by hand: p = (0.6, 0.4), prior = (0.8, 0.2) -> (0.75, 2) / 2.75
    got = debias(torch.tensor([[0.6, 0.4]]), torch.tensor([0.8, 0.2]))
    assert torch.allclose(got, torch.tensor([[0.75 / 2.75, 2 / 2.75]]))


def test_debias_clamps_the_prior():
    got = debias(torch.tensor([[0.5, 0.5]]), torch.tensor([1.0, 0.0]), eps=1e-6)
    assert torch.isfinite(got).all() and got[0, 1] > 0.99


def test_dpl_changes_pseudo_labels_exactly_as_the_formula_says():
    probs = torch.tensor([[0.96, 0.04], [0.6, 0.4], [0.3, 0.7], [0.1, 0.9]])
    prior = torch.tensor([0.9, 0.1])
    labels, mask = pseudo_label(probs, 0.95)
    assert labels.tolist() == [0, 0, 1, 1] and mask.tolist() == [True, False, False, False]
    labels, mask = pseudo_label(debias(probs, prior), 0.95)
    # p / prior, normalised: (1.067, .4) -> .727 | (.667, 4) -> .857 for class 1
    # | (.333, 7) -> .9545 | (.111, 9) -> .988
    assert labels.tolist() == [0, 1, 1, 1] and mask.tolist() == [False, False, True, True]


def test_threshold_is_inclusive():
    _, mask = pseudo_label(torch.tensor([[0.95, 0.05]]), 0.95)
    assert mask.item()


def test_momentum_update_and_masked_ce_normalisation():
    assert torch.allclose(
        momentum_update(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), 0.5),
        torch.tensor([0.5, 0.5]),
    )
    logits, y = torch.zeros(2, 4), torch.tensor([0, 1])
    assert torch.isclose(masked_ce(logits, y, 8), torch.log(torch.tensor(4.0)) * 2 / 8)
    assert masked_ce(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 8).item() == 0.0


def test_pseudo_label_figures_by_true_class_count_the_images_that_weigh_in():
    """Per true class: the used images and those labelled right; with the histogram (by
    pseudo-label) they give each class's precision and recall among the used images."""
    from fssl.methods.base import LocalTrainer
    from fssl.train import ClientData

    trainer = LocalTrainer.__new__(LocalTrainer)
    trainer.num_classes = 3
    y_u = torch.tensor([0, 0, 1, 1, 2, 2])
    labels = torch.tensor([0, 1, 1, 1, 0, 2])
    mask = torch.tensor([True, True, True, False, True, False])
    data = ClientData(torch.empty(0), torch.empty(0), torch.empty(0), y_u)
    stats = trainer.label_stats(labels, mask, data)
    assert stats["pseudo_label_histogram"] == [2, 2, 0]  # labels 0, 1, 1, 0 used
    assert stats["pseudo_label_class_true"] == [2, 1, 1]  # true 0, 0, 1, 2 used
    assert stats["pseudo_label_class_correct"] == [1, 1, 0]
    assert stats["pseudo_label_accuracy"] == 0.5
    weights = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.25, 0.0])  # per-image weights: the same rule
    assert trainer.label_stats(labels, weights, data)["pseudo_label_class_true"] == [1, 1, 1]

"""APP-U and the semi-supervised loss terms (paper section 4); DPL is fssl/methods/dpl.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def app_u(probs: torch.Tensor) -> torch.Tensor:
    """Average prediction probability over samples (dim 0): a K-vector, never a scalar."""
    return probs.mean(dim=0)


def momentum_update(
    prior: torch.Tensor, epoch_estimate: torch.Tensor, gamma: float
) -> torch.Tensor:
    """p_bar <- gamma * p_bar + (1 - gamma) * p_bar^e (Algorithm 2)."""
    return gamma * prior + (1.0 - gamma) * epoch_estimate


def pseudo_label(probs: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard pseudo-labels and the confidence mask max p >= tau (DPL: fssl/methods/dpl.py)."""
    conf, labels = probs.max(dim=1)
    return labels, conf >= tau


def masked_ce(logits: torch.Tensor, labels: torch.Tensor, denominator: int) -> torch.Tensor:
    """Sum of CE over the given (confident) samples divided by `denominator` (N_u in the paper)."""
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits, labels, reduction="sum") / max(denominator, 1)


def mixup(x1: torch.Tensor, x2: torch.Tensor, lam: float) -> torch.Tensor:
    """lam * x1 + (1 - lam) * x2 (SemiFL's mix inputs)."""
    return lam * x1 + (1.0 - lam) * x2


def mix_ce(logits: torch.Tensor, y1: torch.Tensor, y2: torch.Tensor, lam: float) -> torch.Tensor:
    """lam * CE(logits, y1) + (1 - lam) * CE(logits, y2), batch means (SemiFL's mix loss)."""
    return lam * F.cross_entropy(logits, y1) + (1.0 - lam) * F.cross_entropy(logits, y2)

"""UDA (Xie et al., NeurIPS 2020, "Unsupervised Data Augmentation for Consistency Training"):
FixMatch whose targets are the weak view's prediction sharpened with a temperature, soft targets
learnt by cross-entropy on strong views where the prediction is confident.

Per step (the current local model's weak views, `method.pseudo_labels: online`, as USB): with p
the weak view's probabilities (DPL's output when DPL is on), the target is p^(1/T) renormalised,
i.e. softmax(logits / T), T = `method.temperature` = 0.4; the mask is max p >= `train.tau` = 0.8
(USB's p_cutoff), of p before sharpening; the loss on strong views is the soft cross-entropy
-sum_k t_k log q_k times the mask, divided as the regime divides FixMatch's (USB: the batch's
mean, `train.unlabeled_loss_norm=all`). USB's semilearn/algorithms/uda is the reference; where it
departs (its targets are not sharpened; no TSA) is in docs/methods/baselines.md.
"""

from __future__ import annotations

from typing import Any

import torch

from ..checks import number
from . import register
from .fixmatch import FixMatch


@register("uda")
class UDA(FixMatch):
    display = "UDA"

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        number({"method": m}, "method.temperature", low=0, open_low=True, default=None)

    def select(self, probs, idx, learn, raw=None):
        """Targets softmax(log p / T) (= softmax(logits / T) of the model's own probabilities);
        the mask from p itself. The log form keeps a small T from underflowing p^(1/T)."""
        targets = torch.softmax(probs.log() / self.cfg["method"]["temperature"], dim=1)
        return targets, probs.max(1).values >= self.tr["tau"]

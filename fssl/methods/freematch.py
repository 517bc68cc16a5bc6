"""FreeMatch (Wang et al., ICLR 2023): FixMatch with self-adaptive thresholds and a fairness
regulariser.

Thresholds. From each batch's weak-view probabilities p (before its mask, as the authors' code in
USB), exponential moving averages with momentum m: the global threshold
tau_t = m tau_{t-1} + (1 - m) mean max p, the model's class-wise expectation
p~_t = m p~_{t-1} + (1 - m) mean p, and the histogram of its predicted classes h~_t; all start at
1/K. An image is kept when max p >= tau_t p~_t(c) / max_c' p~_t(c'), c its argmax.
Fairness (self-adaptive fairness, SAF): on the kept images' strong views, with p-bar their mean
prediction and h-bar the histogram of their argmax, L_f = sum_c a(c) log b(c),
a = SumNorm(p~ / h~), b = SumNorm(p-bar / h-bar) (minus the cross-entropy H(a, b): minimising it
spreads the batch's predictions over the classes), weighted by `method.lambda_f`.

Federated: tau_t, p~ and h~ are the client's own, kept between its rounds in Flower's
context.state and never sent or averaged. Pseudo-labels come from the current local model at each
step (`method.pseudo_labels: online`). The paper's momentum 0.999 is set for 2^20 steps, over which
the estimates settle within the first 0.1 %; a client here takes a few hundred steps in all, so
`method.ema` is 0.97 (a time constant of 33 steps, about a tenth of a miniature client's training:
docs/methods.md). DPL, when on, debiases the probabilities the mask and labels are made from; the
estimates follow the model's own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..checks import number
from . import register
from .fixmatch import FixMatch


@register("freematch")
class FreeMatch(FixMatch):
    display = "FreeMatch"
    keeps = ("time_p", "p_model", "label_hist")  # tau_t, p~, h~

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        number({"method": m}, "method.ema", low=0, high=1, open_high=True, default=None)
        number({"method": m}, "method.lambda_f", low=0, default=None)

    def begin_round(self, model, data, probs_u, prior):
        k = probs_u.shape[1]
        uniform = torch.full((k,), 1.0 / k, device=self.device)
        self.estimates.start(
            time_p=uniform[:1].clone(), p_model=uniform, label_hist=uniform.clone()
        )
        return super().begin_round(model, data, probs_u, prior)

    def update(self, probs: torch.Tensor) -> None:
        m, e = self.cfg["method"]["ema"], self.estimates
        conf, labels = probs.max(1)
        hist = torch.bincount(labels, minlength=probs.shape[1]).to(probs.dtype)
        e.update("time_p", conf.mean(), m)
        e.update("p_model", probs.mean(0), m)
        e.update("label_hist", hist / hist.sum(), m)

    def select(self, probs, idx, learn, raw=None):
        if learn:  # before the mask, as the authors' code; of the model's own probabilities
            self.update(probs if raw is None else raw)
        e = self.estimates
        conf, labels = probs.max(1)
        scaled = e["p_model"] / e["p_model"].max()
        return labels, conf >= e["time_p"] * scaled[labels]

    def unlabeled_loss(self, logits, target, mask, denom, idx=None):
        loss = super().unlabeled_loss(logits, target, mask, denom, idx)
        weight = self.cfg["method"]["lambda_f"]
        kept = logits if mask is None else logits[mask.bool()]
        if weight == 0 or len(kept) == 0:
            return loss
        return loss + weight * self.fairness(kept)

    def fairness(self, logits: torch.Tensor) -> torch.Tensor:
        """SAF on the kept images' strong-view logits (USB's `entropy_loss`)."""
        probs = F.softmax(logits, 1)
        hist = torch.bincount(probs.argmax(1), minlength=probs.shape[1]).to(probs.dtype)
        hist = hist / hist.sum()
        e = self.estimates
        a = e["p_model"] * torch.nan_to_num(1 / e["label_hist"], posinf=0.0)
        a = (a / a.sum()).detach()
        b = probs.mean(0) * torch.nan_to_num(1 / hist, posinf=0.0).detach()
        b = b / b.sum()
        return (a * torch.log(b + 1e-12)).sum()

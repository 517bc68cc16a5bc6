"""SoftMatch (Chen et al., ICLR 2023, "SoftMatch: Addressing the Quantity-Quality Trade-off in
Semi-Supervised Learning"): FixMatch whose unlabeled images all count, each weighted by a truncated
Gaussian of its confidence, with uniform alignment of the probabilities.

Per step (the current local model's weak views, `method.pseudo_labels: online`, as the paper):
the label is the argmax of the probabilities as they come (USB: uniform alignment is not used to
make the labels); the weight comes from the aligned probabilities: uniform alignment divides them
by p-hat, an EMA of the model's mean prediction (the first batch's mean at a client's start, as
USB's `DistAlignEMAHook`), and renormalises; the weight is 1 where the aligned max probability p
reaches mu, else exp(-(p - mu)^2 / (2 sigma^2 / n_sigma^2)), with mu and sigma^2 EMAs of the
batch's mean and (unbiased) variance of p (from 1/K and 1). p-hat moves (from the unaligned
probabilities) before the alignment, mu and sigma^2 before the batch's weights, as USB's hooks
(semilearn/algorithms/softmatch and hooks/dist_align.py, the reference implementation). The loss
on strong views is the weighted cross-entropy, divided as the regime divides FixMatch's
(`train.unlabeled_loss_norm`: all, USB's mean over the batch; confident, the authors' regime: the
weights' sum, which USB does not do).

Federated: mu, sigma^2 and p-hat are the client's own, kept between its rounds in Flower's
context.state, never sent or averaged (as FreeMatch's and DebiasPL's estimates). USB's momentum
0.999 is set for 2^20 steps; a client here takes a few hundred, so `method.ema` is 0.97
(docs/methods.md). With DPL on, the weights and labels come from DPL's output; p-hat follows the
model's own probabilities. Its own per-client figures: mu and sigma^2 after the round.
"""

from __future__ import annotations

from typing import Any

import torch

from ..checks import number
from . import register
from .fixmatch import FixMatch


@register("softmatch")
class SoftMatch(FixMatch):
    display = "SoftMatch"
    keeps = ("p_hat", "mu", "var")

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        number({"method": m}, "method.ema", low=0, high=1, open_high=True, default=None)
        number({"method": m}, "method.n_sigma", low=0, open_low=True, default=None)

    def begin_round(self, model, data, probs_u, prior):
        k = probs_u.shape[1]
        self.estimates.start(  # a new client's; p-hat waits for its first batch
            mu=torch.tensor(1.0 / k, device=self.device), var=torch.tensor(1.0, device=self.device)
        )
        return super().begin_round(model, data, probs_u, prior)

    def select(self, probs, idx, learn, raw=None):
        s, m = self.estimates, self.cfg["method"]["ema"]
        if learn:  # p-hat from the model's own probabilities, before the alignment
            s.update("p_hat", (probs if raw is None else raw).mean(0), m)
        labels = probs.argmax(1)  # not aligned (USB)
        aligned = probs if "p_hat" not in s else probs / s["p_hat"]  # target 1/K cancels
        aligned = aligned / aligned.sum(1, keepdim=True)
        conf = aligned.max(1).values
        if learn and len(conf) > 1:  # mu and sigma^2 of the batch, before its weights
            s.update("mu", conf.mean(), m)
            s.update("var", conf.var(unbiased=True), m)
        spread = 2 * s["var"] / self.cfg["method"]["n_sigma"] ** 2
        weights = torch.exp(-((conf - s["mu"]).clamp(max=0.0) ** 2) / spread)
        return labels, weights

    def client_metrics(self) -> dict[str, float]:
        s = self.estimates
        return {"mu": float(s["mu"]), "var": float(s["var"])} if "mu" in s else {}

"""DebiasPL (Wang et al., CVPR 2022, "Debiased Learning from Naturally Imbalanced Pseudo-Labels"):
FixMatch whose pseudo-labels are debiased by the model's own running mean prediction, the
logit-adjusted pseudo-labelling that FedDB's DPL is closest to.

q-hat is an exponential moving average (momentum `method.ema`) of the mean weak-view prediction
over the unlabeled batches, starting at 1/K. Pseudo-labels come from softmax(f(weak) - lambda log
q-hat) = normalise(p / q-hat^lambda) and are kept where its max >= tau; the loss on strong views is
the adaptive marginal loss CE(f(strong) + lambda log q-hat, label). lambda (`method.debias`) is 0.5
here (the official main_DebiasPL.py defaults to 1.0; its scripts and USB use 0.4). Unlike DPL, which divides by the client's APP-U of the received model (a prior that
mixes the model's bias with the client's class skew), q-hat follows the local model's predictions
over the rounds.

Federated: q-hat is the client's own, kept between its rounds in Flower's context.state and never
sent or averaged. Pseudo-labels come from the current local model at each step
(`method.pseudo_labels: online`), as in the paper, and q-hat moves after each step's labels. The
authors' momentum 0.999 is set for 2^20 steps; a client here takes a few hundred, so `method.ema`
is 0.97 (as FreeMatch's: docs/methods.md). DPL, when on, divides by APP-U before the adjustment;
q-hat follows the model's own predictions.
"""

from __future__ import annotations

from typing import Any

import torch

from ..checks import number
from . import register
from .fixmatch import FixMatch


@register("debiaspl")
class DebiasPL(FixMatch):
    display = "DebiasPL"
    keeps = ("q_hat",)

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        number({"method": m}, "method.ema", low=0, high=1, open_high=True, default=None)
        number({"method": m}, "method.debias", low=0, default=None)

    def begin_round(self, model, data, probs_u, prior):
        k = probs_u.shape[1]
        self.estimates.start(q_hat=torch.full((k,), 1.0 / k, device=self.device))
        return super().begin_round(model, data, probs_u, prior)

    def select(self, probs, idx, learn, raw=None):
        q_hat = self.estimates["q_hat"]
        adjusted = probs * q_hat.pow(-self.cfg["method"]["debias"])
        conf, labels = (adjusted / adjusted.sum(1, keepdim=True)).max(1)
        self.margin = self.cfg["method"]["debias"] * q_hat.log()  # for this step's loss
        if learn:  # q-hat follows the model's own mean prediction
            mean = (probs if raw is None else raw).mean(0)
            self.estimates.update("q_hat", mean, self.cfg["method"]["ema"])
        return labels, conf >= self.tr["tau"]

    def unlabeled_loss(self, logits, target, mask, denom, idx=None):
        return super().unlabeled_loss(logits + self.margin, target, mask, denom, idx)

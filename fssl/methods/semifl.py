"""SemiFL's client (Diao et al., NeurIPS 2022), as the FedDB paper ran it (client side only).

At the start of the round the received global model labels ALL local unlabeled data once (weak views,
debiased by APP-U when `dpl`). The fix set is the samples with max p >= tau; each step pairs every fix
sample with a mix partner drawn uniformly with replacement from all local unlabeled data, with its hard
pseudo-label (confident or not). With lambda ~ Beta(alpha, alpha), one per step:
    L = CE(y, f(a(x_l))) + CE(y_fix, f(A(u_fix)))
        + lambda CE(y_fix, f(x_mix)) + (1 - lambda) CE(y_partner, f(x_mix)),
    x_mix = lambda a(u_fix) + (1 - lambda) a(u_partner)       (a weak, A strong views)
The fix and mix terms are batch means (no N_u normalisation: the mask was applied when the sets were
built). A client with no confident sample trains on its labels only; without labels it trains on
nothing and sits the round out (`SemiFLServer.sits_out`). In labels-at-clients the
server has no data, so server fine-tuning and static BN are dropped there; in labels-at-server
(SemiFL's own) the server fine-tunes the aggregate and, with model.norm=bn, recomputes BatchNorm
statistics on its labels (fssl/server_train.py).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import augment
from ..checks import boolean, number
from ..losses import mix_ce, mixup
from . import register
from .base import LocalTrainer, MethodServer


class SemiFLServer(MethodServer):
    """SemiFL as published: a client without labels whose pseudo-labels all fell below tau
    trained on nothing and sits the round out (its official code leaves it out of the update),
    so the others share its weight; with none left the global model stays."""

    def sits_out(self, metrics: dict[str, Any]) -> bool:
        return metrics["num_labeled"] == 0 and not (metrics.get("pseudo_label_count") or 0)


@register("semifl")
class SemiFL(LocalTrainer):
    uses_unlabeled = True
    display = "SemiFL"
    server = SemiFLServer

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        number({"method": m}, "method.mix_alpha", low=0, open_low=True, default=None)
        boolean({"method": m}, "method.static_bn", default=False)

    def begin_round(self, model, data, probs_u, prior):
        labels, mask = self.pseudo_labels(probs_u, prior)
        self.pl_labels = labels  # every sample's label: mix partners use it
        self.fix_idx = mask.nonzero(as_tuple=True)[0]
        return self.label_stats(labels, mask, data)

    def unlabeled_count(self, data):
        return len(self.fix_idx)

    def unlabeled_batch(self, model, data, unl_idx, prior):
        fix = self.fix_idx if unl_idx is None else self.fix_idx[unl_idx]
        if len(fix) == 0:
            return None, 0, None
        partners = torch.randint(len(data.y_u), (len(fix),), generator=self.gen, device=self.device)
        lam = float(self.rng.beta(self.cfg["method"]["mix_alpha"], self.cfg["method"]["mix_alpha"]))
        self.last_lambda = lam
        x_fix = self.norm(augment.strong(data.x_u[fix], self.flip, self.gen))
        x_mix = mixup(
            self.norm(augment.weak(data.x_u[fix], self.flip, self.gen)),
            self.norm(augment.weak(data.x_u[partners], self.flip, self.gen)),
            lam,
        )
        y_fix, y_partner = self.pl_labels[fix], self.pl_labels[partners]
        n = len(fix)

        def loss_fn(logits: torch.Tensor) -> torch.Tensor:
            fix_loss = torch.nn.functional.cross_entropy(logits[:n], y_fix)
            return fix_loss + mix_ce(logits[n:], y_fix, y_partner, lam)

        return (x_fix, x_mix), 2 * n, loss_fn

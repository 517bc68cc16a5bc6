"""FixMatch (Sohn et al., NeurIPS 2020) as FedDB's client: hard pseudo-labels from weak views,
kept when max p >= tau, cross-entropy on strong views. FedDB is this class with DPL and DMA on
(conf/method/feddb.yaml); the pseudo-labelling methods that vary it subclass it and override a hook:
`select` (how labels and their mask are made from weak-view probabilities, after DPL, and what the
method learns from them), `unlabeled_loss` (the loss on strong views), `client_state` (what a
client keeps between its rounds)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import augment
from ..losses import masked_ce
from . import register
from .base import LocalTrainer


@register("fixmatch")
class FixMatch(LocalTrainer):
    """With `method.pseudo_labels: round` the pseudo-labels are formed once per round from the
    received model's pass over weak views of all local unlabeled data (paper Algorithm 2), in
    both modes; with `online` from the current local model at each step. Metrics describe the
    received model's labels."""

    uses_unlabeled = True
    display = "FixMatch"

    # -- hooks -----------------------------------------------------------------------------
    def unlabeled_loss(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        mask: torch.Tensor | None,
        denom: float | torch.Tensor,
    ) -> torch.Tensor:
        """Strong-view loss: CE on the masked samples over `denom` (`mask` None: every row is
        confident)."""
        if mask is None:
            return masked_ce(logits, target, int(denom))
        return (F.cross_entropy(logits, target, reduction="none") * mask).sum() / denom

    # -- the round -------------------------------------------------------------------------
    def online(self) -> bool:
        return self.cfg["method"].get("pseudo_labels", "round") == "online"

    def begin_round(self, model, data, probs_u, prior):
        everyone = torch.arange(len(probs_u), device=probs_u.device)
        labels, mask = self.pseudo_labels(probs_u, prior, everyone, learn=not self.online())
        self.pl_labels, self.pl_mask = labels, mask
        self.conf_idx = (mask > 0).nonzero(as_tuple=True)[0]
        return self.label_stats(labels, mask, data)

    def unlabeled_batch(self, model, data, unl_idx, prior):
        norm_all = self.tr["unlabeled_loss_norm"] == "all"
        if unl_idx is None and self.online():
            unl_idx = torch.arange(len(data.y_u), device=self.device)
        if unl_idx is None:  # full batch, offline pseudo-labels
            idx = self.conf_idx
            if len(idx) == 0:
                return None, 0, None
            x_s = self.norm(augment.strong(data.x_u[idx], self.flip, self.gen))
            target = self.pl_labels[idx]
            if self.pl_mask.dtype != torch.bool:  # per-image weights
                w = self.pl_mask[idx]
                denom = len(self.pl_mask) if norm_all else w.sum().clamp_min(1.0)
                return x_s, len(idx), lambda logits: self.unlabeled_loss(logits, target, w, denom)
            denom = len(self.pl_mask) if norm_all else len(idx)
            return x_s, len(idx), lambda logits: self.unlabeled_loss(logits, target, None, denom)
        if not self.online():  # mini-batch, per round
            target, mask = self.pl_labels[unl_idx], self.pl_mask[unl_idx].float()
            x_s = self.norm(augment.strong(data.x_u[unl_idx], self.flip, self.gen))
            denom = len(unl_idx) if norm_all else mask.sum().clamp_min(1.0)
            return (
                x_s,
                len(unl_idx),
                lambda logits: self.unlabeled_loss(logits, target, mask, denom),
            )
        # mini-batch, online: weak and strong views in one forward, labels from the weak half
        u = data.x_u[unl_idx]
        x_w = self.norm(augment.weak(u, self.flip, self.gen))
        x_s = self.norm(augment.strong(u, self.flip, self.gen))

        def loss_fn(logits: torch.Tensor) -> torch.Tensor:
            lw, ls = logits[: len(u)], logits[len(u) :]
            labels, mask = self.pseudo_labels(F.softmax(lw.detach(), 1), prior, unl_idx, learn=True)
            mask = mask.float()  # weights, not indexing: no host sync
            denom = len(u) if norm_all else mask.sum().clamp_min(1.0)
            return self.unlabeled_loss(ls, labels, mask, denom)

        return (x_w, x_s), 2 * len(u), loss_fn

"""FixMatch (Sohn et al., NeurIPS 2020) as FedDB's client: hard pseudo-labels from weak views,
kept when max p >= tau, cross-entropy on strong views. FedDB is this class with DPL and DMA on
(conf/method/feddb.yaml); the pseudo-labelling methods that vary it subclass it and override a hook:
`select` (how targets, hard labels or distributions, and their mask are made from weak-view
probabilities, after DPL, and what the method learns from them), `unlabeled_loss` (the loss on
strong views), `keeps` (the estimates a client keeps between its rounds:
fssl/methods/estimates.py)."""

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
    both modes; with `online` from the current local model at each step. The pseudo-label
    figures describe the targets that trained: the round's (all images) or the steps' rows."""

    uses_unlabeled = True
    display = "FixMatch"

    # -- hooks -----------------------------------------------------------------------------
    def unlabeled_loss(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        mask: torch.Tensor | None,
        denom: float | torch.Tensor,
        idx: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Strong-view loss: cross-entropy with the targets (hard labels, or distributions: soft
        cross-entropy) of the masked rows over `denom` (`mask` None: every row is kept, or
        per-image weights). `idx`: the rows' unlabeled images (per-image state)."""
        if mask is None:
            return masked_ce(logits, target, int(denom))
        return (F.cross_entropy(logits, target, reduction="none") * mask).sum() / denom

    # -- the round -------------------------------------------------------------------------
    def online(self) -> bool:
        return self.cfg["method"].get("pseudo_labels", "round") == "online"

    def begin_round(self, model, data, probs_u, prior):
        if self.online():  # each step makes (and counts) its own targets
            return {}
        everyone = torch.arange(len(probs_u), device=probs_u.device)
        self.pl_targets, self.pl_mask = self.pseudo_labels(probs_u, prior, everyone, learn=True)
        self.conf_idx = (self.pl_mask > 0).nonzero(as_tuple=True)[0]
        self.count_targets(self.pl_targets, self.pl_mask, everyone, data)
        return {}

    def unlabeled_batch(self, model, data, unl_idx, prior):
        norm_all = self.tr["unlabeled_loss_norm"] == "all"
        if unl_idx is None and self.online():
            unl_idx = torch.arange(len(data.y_u), device=self.device)
        if unl_idx is None:  # full batch, offline pseudo-labels
            idx = self.conf_idx
            if len(idx) == 0:
                return None, 0, None
            x_s = self.norm(augment.strong(data.x_u[idx], self.flip, self.gen))
            target = self.pl_targets[idx]
            if self.pl_mask.dtype != torch.bool:  # per-image weights
                w = self.pl_mask[idx]
                denom = len(self.pl_mask) if norm_all else w.sum().clamp_min(1.0)
                return x_s, len(idx), lambda lg: self.unlabeled_loss(lg, target, w, denom, idx)
            denom = len(self.pl_mask) if norm_all else len(idx)
            return x_s, len(idx), lambda lg: self.unlabeled_loss(lg, target, None, denom, idx)
        if not self.online():  # mini-batch, per round
            target, mask = self.pl_targets[unl_idx], self.pl_mask[unl_idx].float()
            x_s = self.norm(augment.strong(data.x_u[unl_idx], self.flip, self.gen))
            denom = len(unl_idx) if norm_all else mask.sum().clamp_min(1.0)
            return (
                x_s,
                len(unl_idx),
                lambda logits: self.unlabeled_loss(logits, target, mask, denom, unl_idx),
            )
        # mini-batch, online: weak and strong views in one forward, targets from the weak half
        u = data.x_u[unl_idx]
        x_w = self.norm(augment.weak(u, self.flip, self.gen))
        x_s = self.norm(augment.strong(u, self.flip, self.gen))

        def loss_fn(logits: torch.Tensor) -> torch.Tensor:
            lw, ls = logits[: len(u)], logits[len(u) :]
            probs = F.softmax(lw.detach(), 1)
            targets, mask = self.pseudo_labels(probs, prior, unl_idx, learn=True)
            self.count_targets(targets, mask, unl_idx, data)
            mask = mask.float()  # weights, not indexing: no host sync
            denom = len(u) if norm_all else mask.sum().clamp_min(1.0)
            return self.unlabeled_loss(ls, targets, mask, denom, unl_idx)

        return (x_w, x_s), 2 * len(u), loss_fn

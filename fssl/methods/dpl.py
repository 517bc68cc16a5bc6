"""DPL, debiased pseudo-labelling (paper section 4.2, equation 8), as one hook: before a client
labels, its model's weak-view probabilities are divided by a prior and renormalised, so that a
class the model over-predicts loses the confidence it owes to that bias. On with `dpl=true`
(FedDB, FixMatch-FedDPL, any method with `dpl=true`); every method that labels through
`LocalTrainer.pseudo_labels` (fssl/methods/base.py) gets it, and FedMatch through its own
agreement rule.

What it divides by (`dpl_prior`): `local` (the paper) the client's APP-U, which removes the
model's bias together with the client's own class skew; `global` the server's aggregated APP-U
sent with the model: the model's bias over the pools of the last round's clients, their class mix
included, not this client's own skew (nothing before the server has aggregated one)."""

from __future__ import annotations

from typing import Any

import torch


def debias(probs: torch.Tensor, prior: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """p_hat = normalize(p(y|x) / p_bar), the prior clamped at eps (equation 8)."""
    scaled = probs / prior.clamp_min(eps)[None, :]
    return scaled / scaled.sum(dim=1, keepdim=True)


def prior_for(
    cfg: dict[str, Any], local: torch.Tensor, global_prior: torch.Tensor | None
) -> torch.Tensor | None:
    """The prior a client's pseudo-labels are divided by, or None (no DPL): the one place DPL is
    decided. `local`: the client's APP-U; `global_prior`: the server's, when it sent one."""
    if not cfg["dpl"]:
        return None
    return global_prior if cfg.get("dpl_prior", "local") == "global" else local

"""Your own method, by path: FixMatch whose strong-view loss uses label smoothing.

Run it with the project's clients and server, from any directory:

    flwr run /path/to/feddb-flower --run-config \
        "method='/abs/path/smoothed_fixmatch.py:SmoothedFixMatch' overrides='+method.params.smoothing=0.2'"

or, with this directory on PYTHONPATH, `method='smoothed_fixmatch:SmoothedFixMatch'`. Every process
that trains (each SuperNode, in a deployment) loads the class from that path. The method takes
conf/method/custom.yaml's defaults (DPL and DMA off, `dpl=true dma=true` switch them on: they are
hooks of every pseudo-labelling method); its own parameters live under `method.params`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fssl.config import number
from fssl.methods.fixmatch import FixMatch


class SmoothedFixMatch(FixMatch):
    display = "FixMatch (label smoothing)"  # how `feddb report` names its runs

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        # checked before anything starts: a bad value is one line naming the key, exit 2
        number({"method": m}, "method.params.smoothing", low=0, high=1, default=0.1)

    def unlabeled_loss(
        self,
        logits: torch.Tensor,
        target: torch.Tensor,
        mask: torch.Tensor | None,
        denom: float | torch.Tensor,
    ) -> torch.Tensor:
        smoothing = float(self.cfg["method"]["params"].get("smoothing", 0.1))
        ce = F.cross_entropy(logits, target, reduction="none", label_smoothing=smoothing)
        if mask is None:  # every row confident (full-batch mode)
            return ce.sum() / max(int(denom), 1)
        return (ce * mask).sum() / denom

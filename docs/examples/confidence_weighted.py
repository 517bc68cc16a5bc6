"""Your own method, by path: FixMatch whose unlabeled images all count, each weighted by its
confidence raised to a power (a soft-weighting method, as SoftMatch is).

Run it with the project's clients and server, from any directory:

    flwr run /path/to/feddb-flower --run-config \\
        "method='/abs/path/confidence_weighted.py:ConfidenceWeighted' overrides='method.power=3'"

or, with this directory on PYTHONPATH, `method='confidence_weighted:ConfidenceWeighted'`; sweep it
beside FixMatch with `feddb sweep -m row=fixmatch,/abs/path/confidence_weighted.py:ConfidenceWeighted`.
Every process that trains (each SuperNode, in a deployment) loads the class from that path. It
needs no YAML: `defaults` gives its `method.*` values (a user's `method.<key>=...` wins), DPL and
DMA are off unless `dpl=true dma=true` (hooks of every pseudo-labelling method).
"""

from __future__ import annotations

from typing import Any

import torch

from fssl.checks import number
from fssl.methods.fixmatch import FixMatch


class ConfidenceWeighted(FixMatch):
    display = "FixMatch (confidence-weighted)"  # how `feddb report` names its runs
    # its defaults, in place of a YAML: labels from the current model at each step, power 2
    defaults = {"pseudo_labels": "online", "power": 2.0}

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        # checked before anything starts: a bad value is one line naming the key, exit 2
        number({"method": m}, "method.power", low=0, open_low=True)

    def begin_round(self, model, data, probs_u, prior):
        self.weight_sum, self.weight_count = 0.0, 0  # this round's weights, for its figure
        return super().begin_round(model, data, probs_u, prior)

    def select(
        self, probs: torch.Tensor, idx: torch.Tensor | None, learn: bool, raw=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Labels and per-image weights in [0, 1] (a bool mask would keep or drop each image)."""
        conf, labels = probs.max(1)
        weights = conf ** self.cfg["method"]["power"]
        if learn:  # these labels train the model
            self.weight_sum += float(weights.sum())
            self.weight_count += len(weights)
        return labels, weights

    def client_metrics(self) -> dict[str, float]:
        """Its own per-client figure: the mean weight of the round's training labels (in
        metrics.jsonl's client records and `feddb report`'s tables)."""
        if not getattr(self, "weight_count", 0):  # a warm-up round makes no labels
            return {}
        return {"mean_weight": self.weight_sum / self.weight_count}

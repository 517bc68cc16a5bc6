"""FlexMatch (Zhang et al., NeurIPS 2021): FixMatch with Curriculum Pseudo Labeling, a threshold
per class that rises with how well the model has learnt that class.

A class's learning effect sigma(c) is the number of unlabeled images whose latest confident
prediction (max p >= tau) was c; beta(c) = sigma(c) / max(max_c' sigma(c'), N_unused), where
N_unused counts images never predicted confidently (the threshold warm-up: while most images are
unused, every class's threshold stays low); the threshold of class c is
T(c) = M(beta(c)) tau with the convex mapping M(x) = x / (2 - x), and an image is kept when its
max p >= T(argmax p). As in the authors' code (TorchSSL/USB), the mask of a batch is made with the
thresholds before the batch updates the images' latest confident predictions.

Federated: the record of each image's latest confident prediction is the client's own (its images
only), kept between its rounds in Flower's context.state and never sent or averaged, so each
client's curriculum follows its own classes. Pseudo-labels come from the current local model at
each step (`method.pseudo_labels: online`), as in the paper. DPL, when on, debiases the
probabilities before the thresholds; DMA weighs the clients' updates as for any method.
"""

from __future__ import annotations

from typing import Any

import torch

from ..checks import boolean
from . import register
from .fixmatch import FixMatch


@register("flexmatch")
class FlexMatch(FixMatch):
    display = "FlexMatch"
    keeps = ("selected",)  # each unlabeled image's latest confident class, -1: none yet

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        boolean({"method": m}, "method.threshold_warmup", default=True)

    def thresholds(self, n_classes: int) -> torch.Tensor:
        """T(c) = M(beta(c)) tau from the images' latest confident predictions."""
        counts = torch.bincount(self.estimates["selected"] + 1, minlength=n_classes + 1).double()
        unused, sigma = counts[0], counts[1:]
        if self.cfg["method"]["threshold_warmup"]:
            scale = torch.maximum(sigma.max(), unused)
        else:
            scale = sigma.max()
        beta = sigma / scale.clamp_min(1.0)
        return (beta / (2.0 - beta) * self.tr["tau"]).float()

    def begin_round(self, model, data, probs_u, prior):
        n = len(data.y_u)
        self.estimates.start(selected=torch.full((n,), -1, dtype=torch.long, device=self.device))
        return super().begin_round(model, data, probs_u, prior)

    def select(self, probs, idx, learn, raw=None):
        conf, labels = probs.max(1)
        mask = conf >= self.thresholds(probs.shape[1])[labels]
        if learn:  # after the mask, as the authors' code
            confident = conf >= self.tr["tau"]
            self.estimates["selected"][idx[confident]] = labels[confident]
        return labels, mask

"""FedDB's server: debiased model aggregation (DMA) on the clients' APP-U, then server momentum."""

from __future__ import annotations

from typing import Any

import numpy as np

from fssl.dma import dma_weights

from .base import WeightedAverage


class FedDB(WeightedAverage):
    """Weights beta chosen by DMA (fssl.dma) so that sum_m beta_m p_bar_m is closest to uniform."""

    def aggregation_weights(self, parsed: list[dict[str, Any]]) -> tuple[np.ndarray, dict]:
        d = self.cfg["dma"]
        res = dma_weights(np.stack([p["app_u"] for p in parsed]), d["mode"], d["steps"], d["lr"],
                          d["optimizer"])
        return res.weights, {"mode": d["mode"], "loss_uniform": res.loss_uniform,
                             "loss_weights": res.loss, "weight_entropy": res.entropy,
                             "weights": res.weights.tolist()}

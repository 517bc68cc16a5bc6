"""Flower strategies (message API): averaging with server momentum (FedAvg, SemiFL, FixMatch,
FedDB with DMA weights), FedRGD's grouped averaging, and FedMatch's helper selection."""

from typing import Any

from .base import WeightedAverage
from .fedmatch import FedMatch
from .fedrgd import FedRGD

STRATEGIES = {"fedavg": WeightedAverage, "fedrgd": FedRGD, "fedmatch": FedMatch}


def make_strategy(cfg: dict[str, Any], num_classes: int) -> WeightedAverage:
    """The method's strategy; `dma.enabled` switches its weights to DMA, `server.*` its update."""
    return STRATEGIES[cfg["method"]["strategy"]](cfg, num_classes)


__all__ = ["FedMatch", "FedRGD", "STRATEGIES", "WeightedAverage", "make_strategy"]

"""Flower strategies (message API): weighted averaging with server momentum, and FedDB's DMA."""

from typing import Any

from .base import WeightedAverage
from .feddb import FedDB


def make_strategy(cfg: dict[str, Any], num_classes: int) -> WeightedAverage:
    """DMA when `dma.enabled`, else plain averaging (`server.weighting`); both with momentum."""
    return (FedDB if cfg["dma"]["enabled"] else WeightedAverage)(cfg, num_classes)


__all__ = ["FedDB", "WeightedAverage", "make_strategy"]

"""Flower strategies (message API): averaging with server momentum (FedAvg, SemiFL, FixMatch,
FedDB with DMA weights), FedRGD's grouped averaging, and FedMatch's helper selection."""

from typing import Any

from .base import WeightedAverage
from .fedmatch import FedMatch
from .fedrgd import FedRGD

STRATEGIES = {"fedavg": WeightedAverage, "fedrgd": FedRGD, "fedmatch": FedMatch}


def make_strategy(cfg: dict[str, Any], num_classes: int) -> WeightedAverage:
    """The method's strategy, or `strategy.name`'s (Flower's or a user's, wrapped so that it runs
    against the project's clients); `dma.enabled` switches its weights to DMA, `server.*` its update,
    `dp.mode` wraps it in Flower's server-side differential-privacy strategy (`driver`)."""
    if cfg.get("strategy", {}).get("name", "method") != "method":
        from .flower import FlowerStrategy     # Flower's or the user's (strategy/flower.py)

        strategy: WeightedAverage = FlowerStrategy(cfg, num_classes)
    else:
        strategy = STRATEGIES[cfg["method"]["strategy"]](cfg, num_classes)
    dp = cfg["dp"]
    if dp["mode"] != "off":
        from flwr.serverapp.strategy import (DifferentialPrivacyServerSideAdaptiveClipping,
                                             DifferentialPrivacyServerSideFixedClipping)

        fl = cfg["fl"]
        sampled = max(1, min(fl["num_clients"], round(fl["fraction_train"] * fl["num_clients"])))
        if dp["mode"] == "fixed":
            strategy.driver = DifferentialPrivacyServerSideFixedClipping(
                strategy, dp["noise_multiplier"], dp["clipping_norm"], sampled)
        else:
            strategy.driver = DifferentialPrivacyServerSideAdaptiveClipping(
                strategy, dp["noise_multiplier"], sampled,
                initial_clipping_norm=dp["clipping_norm"],
                target_clipped_quantile=dp["target_quantile"])
    return strategy


__all__ = ["FedMatch", "FedRGD", "STRATEGIES", "WeightedAverage", "make_strategy"]

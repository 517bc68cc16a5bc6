"""Flower strategies (message API): averaging with server momentum (FedAvg, SemiFL, FixMatch,
FedDB with DMA weights), FedRGD's grouped averaging, and FedMatch's helper selection."""

from typing import Any

from fssl.config import clients_per_round

from .base import RoundRecord, ServerSetup, WeightedAverage
from .fedmatch import FedMatch
from .fedrgd import FedRGD

STRATEGIES = {"fedavg": WeightedAverage, "fedrgd": FedRGD, "fedmatch": FedMatch}


def make_strategy(cfg: dict[str, Any], num_classes: int,
                  setup: ServerSetup | None = None) -> WeightedAverage:
    """The method's strategy, or `strategy.name`'s (Flower's or a user's, wrapped so that it runs
    against the project's clients); `dma.enabled` switches its weights to DMA, `server.*` its update,
    `dp.mode` wraps it in Flower's server-side differential-privacy strategy (`driver`). `setup`:
    what the ServerApp knows of the run (nodes, partition sizes, the loss check's evaluation)."""
    if cfg.get("strategy", {}).get("name", "method") != "method":
        from .flower import FlowerStrategy     # Flower's or the user's (strategy/flower.py)

        strategy: WeightedAverage = FlowerStrategy(cfg, num_classes, setup)
    else:
        strategy = STRATEGIES[cfg["method"]["strategy"]](cfg, num_classes, setup)
    dp = cfg["dp"]
    if dp["mode"] != "off":
        from flwr.serverapp.strategy import (DifferentialPrivacyServerSideAdaptiveClipping,
                                             DifferentialPrivacyServerSideFixedClipping)

        sampled = clients_per_round(cfg)
        if dp["mode"] == "fixed":
            strategy.driver = DifferentialPrivacyServerSideFixedClipping(
                strategy, dp["noise_multiplier"], dp["clipping_norm"], sampled)
        else:
            strategy.driver = DifferentialPrivacyServerSideAdaptiveClipping(
                strategy, dp["noise_multiplier"], sampled,
                initial_clipping_norm=dp["clipping_norm"],
                target_clipped_quantile=dp["target_quantile"])
    return strategy


__all__ = ["FedMatch", "FedRGD", "RoundRecord", "STRATEGIES", "ServerSetup", "WeightedAverage",
           "make_strategy"]

"""Flower strategies (message API): weighted averaging with server momentum around the method's
server side (DMA weights when `dma.enabled`), or Flower's / a user's strategy (`strategy=`)."""

from typing import Any

from fssl.config import choice, clients_per_round

from . import flower, robust
from .base import RoundRecord, ServerSetup, WeightedAverage


def validate(cfg: dict[str, Any]) -> None:
    """The server's part of a configuration: the robust rule and `strategy` (Flower's or a
    user's). fssl.config checks the rest, the method's parameters included."""
    choice(cfg, "server.robust.rule", robust.RULES)
    flower.check_choice(cfg)


def make_strategy(
    cfg: dict[str, Any], num_classes: int, setup: ServerSetup | None = None
) -> WeightedAverage:
    """The method's strategy, or `strategy.name`'s (Flower's or a user's, wrapped so that it runs
    against the project's clients); `dma.enabled` switches its weights to DMA, `server.*` its update,
    `dp.mode` wraps it in Flower's server-side differential-privacy strategy (`driver`). `setup`:
    what the ServerApp knows of the run (nodes, partition sizes, the loss check's evaluation)."""
    if cfg.get("strategy", {}).get("name", "method") != "method":
        strategy: WeightedAverage = flower.FlowerStrategy(cfg, num_classes, setup)
    else:
        strategy = WeightedAverage(cfg, num_classes, setup)
    dp = cfg["dp"]
    if dp["mode"] != "off":
        from flwr.serverapp.strategy import (
            DifferentialPrivacyServerSideAdaptiveClipping,
            DifferentialPrivacyServerSideFixedClipping,
        )

        sampled = clients_per_round(cfg)
        if dp["mode"] == "fixed":
            strategy.driver = DifferentialPrivacyServerSideFixedClipping(
                strategy, dp["noise_multiplier"], dp["clipping_norm"], sampled
            )
        else:
            strategy.driver = DifferentialPrivacyServerSideAdaptiveClipping(
                strategy,
                dp["noise_multiplier"],
                sampled,
                initial_clipping_norm=dp["clipping_norm"],
                target_clipped_quantile=dp["target_quantile"],
            )
    return strategy


__all__ = [
    "RoundRecord",
    "ServerSetup",
    "WeightedAverage",
    "make_strategy",
    "validate",
]

"""Flower strategies (message API): averaging with server momentum (FedAvg, SemiFL, FixMatch,
FedDB with DMA weights), FedRGD's grouped averaging, and FedMatch's helper selection."""

from typing import Any

from fssl.config import choice, clients_per_round

from . import flower, robust
from .base import RoundRecord, ServerSetup, WeightedAverage
from .fedmatch import FedMatch
from .fedrgd import FedRGD

STRATEGIES: dict[str, type[WeightedAverage]] = {
    "fedavg": WeightedAverage,
    "fedrgd": FedRGD,
    "fedmatch": FedMatch,
}


def validate(cfg: dict[str, Any]) -> None:
    """The server's part of a configuration: the method's strategy and its parameters, the
    robust rule, and `strategy` (Flower's or a user's). fssl.config checks the rest."""
    m = cfg["method"]
    name = choice(cfg, "method.strategy", STRATEGIES, default=None)
    # A strategy made for one trainer takes that trainer only; the others take any but those.
    made_for = {c.trainer for c in STRATEGIES.values()} - {None}
    trainer = m["trainer"] if m["trainer"] in made_for else None
    choice(
        cfg,
        "method.strategy",
        [n for n, c in STRATEGIES.items() if c.trainer == trainer],
        note=f"with method.trainer={m['trainer']} (its model and replies belong together)",
    )
    STRATEGIES[name].check_params(m)
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
        strategy = STRATEGIES[cfg["method"]["strategy"]](cfg, num_classes, setup)
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
    "FedMatch",
    "FedRGD",
    "RoundRecord",
    "STRATEGIES",
    "ServerSetup",
    "WeightedAverage",
    "make_strategy",
    "validate",
]

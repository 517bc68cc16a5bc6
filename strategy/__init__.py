"""Flower strategies (message API): the method's own (strategy/base.py: reply intake, a weighting
policy, the update step, around the method's server side), or Flower's / a user's (`strategy=`).
A user's class comes in one way, by path (fssl/plugins.py): a strategy (`strategy.target`), a
weighting policy (`server.weighting`), a robust rule (`server.robust.rule`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fssl.checks import choice
from fssl.config import clients_per_round
from fssl.plugins import is_path

if TYPE_CHECKING:
    from .base import MethodStrategy, RoundRecord, ServerSetup

# The strategies load on first use, not with the package: a ClientApp imports strategy.contract
# (the reply contract) in every process Flower starts for a message, and needs none of them.
_LAZY = {
    "RoundRecord": "base",
    "ServerSetup": "base",
    "MethodStrategy": "base",
    "flower": None,
    "robust": None,
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'strategy' has no attribute {name!r}")
    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    return module if _LAZY[name] is None else getattr(module, name)


def validate(cfg: dict[str, Any]) -> None:
    """The server's part of a configuration: the robust rule, the weighting policies and
    `strategy` (Flower's or a user's), a user's class imported and checked. fssl.config checks the
    rest, the method's parameters included."""
    from . import flower, robust, weighting

    if not is_path(cfg["server"]["robust"]["rule"]):
        choice(cfg, "server.robust.rule", tuple(robust.RULES))
    robust.rule_for(cfg["server"]["robust"])
    for key in ("weighting", "warmup_weighting"):
        if is_path(cfg["server"].get(key)):
            weighting.weighting_class(cfg["server"][key])
    flower.check_choice(cfg)


def make_strategy(
    cfg: dict[str, Any], num_classes: int, setup: ServerSetup | None = None
) -> MethodStrategy:
    """The method's strategy, or `strategy.name`'s (Flower's or a user's, wrapped so that it runs
    against the project's clients); `dma.enabled` switches its weights to DMA, `server.*` its update,
    `dp.mode` wraps it in Flower's server-side differential-privacy strategy (`driver`). `setup`:
    what the ServerApp knows of the run (nodes, partition sizes, the loss check's evaluation)."""
    from . import flower
    from .base import MethodStrategy

    if cfg.get("strategy", {}).get("name", "method") != "method":
        strategy: MethodStrategy = flower.FlowerStrategy(cfg, num_classes, setup)
    else:
        strategy = MethodStrategy(cfg, num_classes, setup)
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
    "MethodStrategy",
    "make_strategy",
    "validate",
]

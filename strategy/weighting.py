"""Weighting policies: the weights beta (on the simplex) of a round's valid replies, behind one
call, `weights(replies, server_round)`. A reply is a dict with `arrays`, `metrics`, `app_u` (its
APP-U, K floats) and `sizes` ((n_l, n_u) the server trusts). A policy may leave what it found in
`notes` (a dict, or None), which the round's record keeps under `dma`.

`server.weighting` names the policy (uniform, samples, or your class by path, fssl/plugins.py);
`dma.enabled` (FedDB) makes it DMA. A labels-only warm-up round (train.warmup_rounds) weighs by
`server.warmup_weighting` (null: server.weighting) with DMA off, whatever the method: the warm-up
is the same run for every method of a seed, so a paired comparison starts from one model.
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fssl.checks import ConfigError
from fssl.methods.dma import dma_weights
from fssl.plugins import is_path, load


class Weighting:
    """Base of every weighting policy: uniform weights. A policy is this class with its own
    `weights`; it is built with the run's configuration and whether the round's clients trained on
    their labels alone (`labels_only`: a warm-up, or a labels-only method)."""

    def __init__(self, cfg: dict[str, Any], labels_only: bool = False) -> None:
        self.cfg, self.labels_only = cfg, labels_only
        self.notes: dict[str, Any] | None = None

    def weights(self, replies: list[dict[str, Any]], server_round: int) -> np.ndarray:
        return np.full(len(replies), 1.0 / len(replies))


class Samples(Weighting):
    """n_m / N: n_m the examples client m trains on (its labels alone for labels-only training,
    and for a labeled client of labels_at_partial_clients, whose unlabeled set is its labeled
    images again, for APP-U), by the sizes the server trusts."""

    def weights(self, replies: list[dict[str, Any]], server_round: int) -> np.ndarray:
        partial = (self.cfg.get("scenario") or {}).get("name") == "labels_at_partial_clients"
        unl = not self.labels_only
        sizes = np.array(
            [n_l + (unl and not (partial and n_l > 0)) * n_u for n_l, n_u in _sizes(replies)],
            dtype=np.float64,
        )
        return sizes / max(sizes.sum(), 1.0)


class DMA(Weighting):
    """FedDB's debiased model aggregation (fssl/methods/dma.py): beta bringing sum_m beta_m p_bar_m
    closest to uniform, within `dma.cap`."""

    def weights(self, replies: list[dict[str, Any]], server_round: int) -> np.ndarray:
        d = self.cfg["dma"]
        res = dma_weights(
            np.stack([r["app_u"] for r in replies]),
            d["mode"],
            d["steps"],
            d["lr"],
            d["optimizer"],
            d["cap"],
        )
        if res.at_cap:
            log(
                INFO,
                "round %s: DMA cap binds: %s of %s clients held at dma.cap/m = %.3f",
                server_round,
                res.at_cap,
                len(replies),
                d["cap"] / len(replies),
            )
        self.notes = {
            "mode": d["mode"],
            "loss_uniform": res.loss_uniform,
            "loss_weights": res.loss,
            "weight_entropy": res.entropy,
            "weights": res.weights.tolist(),
            "cap": d["cap"],
            "at_cap": res.at_cap,
        }
        return res.weights


def _sizes(replies: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [r["sizes"] for r in replies]


WEIGHTINGS: dict[str, type[Weighting]] = {"uniform": Weighting, "samples": Samples, "dma": DMA}


def weighting_class(spec: str) -> type[Weighting]:
    """A policy by name (WEIGHTINGS) or a user's `Weighting` subclass by path."""
    if not is_path(spec):
        if spec not in WEIGHTINGS:
            raise ConfigError(
                f"server.weighting: '{spec}' is not a weighting; choose one of "
                f"{', '.join(WEIGHTINGS)}, or your Weighting subclass as 'pkg.module:Class'"
            )
        return WEIGHTINGS[spec]
    cls = load(spec, f"server.weighting '{spec}'")
    if not (isinstance(cls, type) and issubclass(cls, Weighting)):
        raise ConfigError(
            f"server.weighting '{spec}' is not a subclass of strategy.weighting.Weighting"
        )
    return cls


def policies(cfg: dict[str, Any], uses_unlabeled: bool) -> tuple[Weighting, Weighting]:
    """(the warm-up rounds' policy, the other rounds')."""
    server = cfg["server"]
    warmup = weighting_class(server.get("warmup_weighting") or server["weighting"])
    main = DMA if cfg["dma"]["enabled"] else weighting_class(server["weighting"])
    return warmup(cfg, labels_only=True), main(cfg, labels_only=not uses_unlabeled)

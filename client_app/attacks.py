"""Malicious-node behaviours for the attack tests and the attack benchmark, never reachable from a
normal run: a node takes one only when its `node_config` names it (`attack="sign_flip"`) AND its
environment sets FEDDB_TEST_ATTACKS=1. No run-config key reaches this code.

- uniform_app_u: report the uniform APP-U (a valid probability vector; unbounded DMA then hands
  this client the aggregate);
- inflated_sizes: claim 1000x its labeled and unlabeled counts (n_m/N weighting);
- scaled_update: send w + 1000 * (w_m - w);
- sign_flip: send w - (w_m - w);
  (both keep the BatchNorm running statistics honest: the reply check refuses a negative
  variance, and an attacker who knows it sends valid ones)
- nan: send NaN in the first floating array (rejected by the server's reply check).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from strategy.contract import STAT_SUFFIXES

ATTACKS = ("uniform_app_u", "inflated_sizes", "scaled_update", "sign_flip", "nan")
ENV = "FEDDB_TEST_ATTACKS"


def attack_of(node_config: dict[str, Any]) -> str | None:
    kind = node_config.get("attack")
    if not kind:
        return None
    if os.environ.get(ENV) != "1":
        raise RuntimeError(
            f"node_config attack='{kind}' is a test-only behaviour; it runs only "
            f"with {ENV}=1 in the node's environment. Remove it from node_config."
        )
    if kind not in ATTACKS:
        raise ValueError(f"unknown attack '{kind}': choose {', '.join(ATTACKS)}")
    return str(kind)


def apply_attack(
    kind: str,
    received: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    metrics: dict[str, Any],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The reply a malicious node sends instead of its honest (state, metrics)."""
    state, metrics = dict(state), dict(metrics)
    floats = [k for k, v in state.items() if v.is_floating_point()]
    if kind == "uniform_app_u":
        k = len(metrics["app_u"])
        metrics["app_u"] = [1.0 / k] * k
    elif kind == "inflated_sizes":
        metrics["num_labeled"] *= 1000
        metrics["num_unlabeled"] *= 1000
    elif kind in ("scaled_update", "sign_flip"):
        factor = 1000.0 if kind == "scaled_update" else -1.0
        for key in (k for k in floats if not k.endswith(STAT_SUFFIXES)):
            w = received[key].to(state[key].dtype)
            state[key] = (w + factor * (state[key] - w)).contiguous()
    elif kind == "nan":
        state[floats[0]] = torch.full_like(state[floats[0]], float("nan"))
    return state, metrics

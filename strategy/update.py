"""The update step: from the round's kept updates and their coefficients to the new global model.

Server update (SPEC section 2): buf <- mu * buf + (w - sum_m beta_m w_m); w <- w - s * buf, where
any weight the clients do not take (1 - sum beta) stays on the current global model w, or on the
server's own model when it trains in parallel (FedRGD's w_s, labels_at_server). BatchNorm running
statistics are combined with the same weights, without momentum. The defences and the rule of
`server.robust` (strategy/robust.py) act first. Flower's or a user's strategy replaces this step
(strategy/flower.py: InnerUpdate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fssl.train import round_lr

from . import robust
from .contract import STAT_SUFFIXES


class ServerUpdate:
    """Server momentum (`server.lr`, `server.momentum`) after `server.robust`'s defences and rule;
    its momentum buffer is part of the strategy's checkpoint."""

    def __init__(
        self,
        cfg: dict[str, Any],
        workers: int = 1,
        audit: Callable[[dict[str, np.ndarray]], float] | None = None,
        audit_workers: int = 1,
    ) -> None:
        self.cfg = cfg
        self.rule = robust.rule_for(cfg["server"]["robust"])
        self.workers, self.audit, self.audit_workers = workers, audit, audit_workers
        self.momentum_buffer: dict[str, np.ndarray] = {}

    def state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """What a checkpoint keeps of this step: the momentum buffer."""
        return {"momentum": dict(self.momentum_buffer)}, {}

    def load_state(self, arrays: dict[str, dict[str, np.ndarray]], state: dict[str, Any]) -> None:
        self.momentum_buffer = dict(arrays.get("momentum", {}))

    def tolerance(self, server_round: int) -> float | None:
        """The loss check's fraction for round t: `server.robust.loss_check`, times lr_t / lr_0
        with `loss_check_scale: lr` (an update's effect on the loss is proportional to its step,
        to first order, so a fixed fraction lets harmful updates through once the steps are
        small: measured, a sign flip passed in the last rounds of a cosine schedule); None: off."""
        rb = self.cfg["server"]["robust"]
        if rb["loss_check"] is None:
            return None
        tol = float(rb["loss_check"])
        if rb.get("loss_check_scale", "lr") == "lr":
            tol *= round_lr(self.cfg, server_round) / float(self.cfg["train"]["lr"])
        return tol

    def defend(
        self,
        old: dict[str, np.ndarray],
        client_arrays: list[dict[str, np.ndarray]],
        weights: np.ndarray,
        record: Any,
        residual: dict[str, np.ndarray] | None,
    ) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
        """`server.robust`'s defences and selection (robust.defend); what they did goes to the
        round's record (`robust`, the loss check's seconds)."""
        client_arrays, weights, record.robust, record.loss_check_seconds = robust.defend(
            old,
            client_arrays,
            weights,
            self.rule,
            record.round,
            self.tolerance(record.round),
            self.workers,
            self.audit,
            self.audit_workers,
            residual,
        )
        return client_arrays, weights

    def __call__(
        self,
        old: dict[str, np.ndarray],
        replies: list[dict[str, Any]],
        weights: np.ndarray,
        record: Any,
        residual: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """The new global model from the global `old`, the round's valid `replies` and their
        coefficients; `residual`: where the weight the clients leave goes (None: on `old`)."""
        client_arrays = [r["arrays"] for r in replies]
        client_arrays, weights = self.defend(old, client_arrays, weights, record, residual)
        return self.combine(old, replies, client_arrays, weights, record, residual)

    def combine(
        self,
        old: dict[str, np.ndarray],
        replies: list[dict[str, Any]],
        client_arrays: list[dict[str, np.ndarray]],
        weights: np.ndarray,
        record: Any,
        residual: dict[str, np.ndarray] | None,
    ) -> dict[str, np.ndarray]:
        """The defended arrays and weights into the new global model: the robust rule's
        average, then server momentum (a Flower strategy's update overrides this step)."""
        s, mu = self.cfg["server"]["lr"], self.cfg["server"]["momentum"]
        new: dict[str, np.ndarray] = {}
        for key, current in old.items():
            if not np.issubdtype(current.dtype, np.floating):  # e.g. num_batches_tracked
                new[key] = np.max([a[key] for a in client_arrays], axis=0).astype(current.dtype)
                continue
            rest = residual[key] if residual is not None else current
            avg = self.rule.combine(rest, [a[key] for a in client_arrays], weights)
            if key.endswith(STAT_SUFFIXES):
                new[key] = avg.astype(current.dtype)
                continue
            step = current.astype(np.float64) - avg
            buf = mu * self.momentum_buffer[key] + step if key in self.momentum_buffer else step
            self.momentum_buffer[key] = buf
            new[key] = (current.astype(np.float64) - s * buf).astype(current.dtype)
        return new


def gradient_diversity(
    global_arrays: dict[str, np.ndarray],
    client_arrays: list[dict[str, np.ndarray]],
    workers: int = 1,
) -> float | None:
    """sum_k |D_k|^2 / |sum_k D_k|^2 over the trainable arrays (FedRGD's Eq. 1); None if all
    updates cancel or nobody moved. The updates in float32, the sums in float64."""
    keys = [
        k
        for k, v in global_arrays.items()
        if np.issubdtype(v.dtype, np.floating) and not k.endswith(STAT_SUFFIXES)
    ]
    flat = robust.flat_updates(global_arrays, client_arrays, keys)

    def sums(block: np.ndarray) -> np.ndarray:  # Σ_k |D_k|², |Σ_k D_k|² over the block
        # (einsum, not np.dot: numpy's BLAS call per block was 4x slower in a simulation run)
        b = block.astype(np.float64)
        total = b.sum(axis=0)
        return np.array([np.einsum("ij,ij->", b, b), np.einsum("i,i->", total, total)])

    sum_sq, denom = robust.block_sums(sums, flat, workers)
    return float(sum_sq) / float(denom) if denom > 0 else None

"""Weighted averaging with server momentum, reproducible sampling by partition id, and per-round
client records. Subclasses choose the aggregation weights (FedDB: DMA).

Server update (SPEC section 2): buf <- mu * buf + (w - sum_m beta_m w_m); w <- w - s * buf.
BatchNorm running statistics (norm `bn`) are averaged with the same weights, without momentum.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fssl.train import cosine_lr

STAT_SUFFIXES = ("running_mean", "running_var")


class ReplyError(ValueError):
    """A client reply cannot be used; the message says why."""


def arrays_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def numpy_to_arrays(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d).
    return ArrayRecord({k: Array(np.require(v, requirements="C")) for k, v in arrays.items()})


class WeightedAverage(FedAvg):
    """Uniform (or sample-weighted) averaging plus server momentum."""

    def __init__(self, cfg: dict[str, Any], num_classes: int) -> None:
        fl = cfg["fl"]
        super().__init__(fraction_train=fl["fraction_train"],
                         fraction_evaluate=fl["fraction_evaluate"],
                         min_train_nodes=fl["min_train_clients"], min_evaluate_nodes=1,
                         min_available_nodes=1)
        self.cfg, self.num_classes = cfg, num_classes
        self.cfg_json = json.dumps(cfg, sort_keys=True)
        self.node_of: dict[int, int] = {}          # partition id -> node id
        self.global_arrays: dict[str, np.ndarray] | None = None
        self.momentum_buffer: dict[str, np.ndarray] = {}
        self.last_round: dict[str, Any] = {}

    # -- sampling --------------------------------------------------------------------------
    def bind_nodes(self, node_of: dict[int, int]) -> None:
        self.node_of = dict(node_of)

    def sample(self, server_round: int, fraction: float) -> list[int]:
        """Partition ids for this round: seeded by (seed, round), independent of node ids."""
        m = self.cfg["fl"]["num_clients"]
        k = max(1, min(m, round(fraction * m)))
        rng = np.random.default_rng([self.cfg["seed"], server_round, 7])
        return sorted(int(i) for i in rng.choice(m, k, replace=False))

    def _messages(self, pids: list[int], arrays: ArrayRecord, config: ConfigRecord,
                  message_type: str) -> list[Message]:
        record = RecordDict({"arrays": arrays, "config": config})
        return [Message(content=record, dst_node_id=self.node_of[p], message_type=message_type)
                for p in pids]

    def lr_for(self, server_round: int) -> float:
        tr = self.cfg["train"]
        return cosine_lr(tr["lr"], server_round, self.cfg["num_rounds"], tr["lr_schedule"])

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        config["server-round"] = server_round
        config["lr"] = self.lr_for(server_round)
        config["run-config"] = self.cfg_json
        return config

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.global_arrays = arrays_to_numpy(arrays)
        pids = self.sample(server_round, self.cfg["fl"]["fraction_train"])
        self.last_round = {"round": server_round, "sampled": pids}
        return self._messages(pids, arrays, self.round_config(server_round, config),
                              MessageType.TRAIN)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        fraction = self.cfg["fl"]["fraction_evaluate"]
        if fraction == 0:
            return []
        pids = self.sample(server_round + 100003, fraction)
        return self._messages(pids, arrays, self.round_config(server_round, config),
                              MessageType.EVALUATE)

    # -- replies ---------------------------------------------------------------------------
    def parse_reply(self, msg: Message) -> dict[str, Any]:
        """Arrays and metrics of one train reply, checked; raises ReplyError if unusable."""
        content = msg.content
        if "arrays" not in content.array_records or "metrics" not in content.metric_records:
            raise ReplyError("reply lacks the 'arrays' ArrayRecord or the 'metrics' MetricRecord")
        arrays = arrays_to_numpy(content.array_records["arrays"])
        assert self.global_arrays is not None
        for key, ref in self.global_arrays.items():
            got = arrays.get(key)
            if got is None or got.shape != ref.shape:
                raise ReplyError(f"array '{key}' missing or of shape "
                                 f"{None if got is None else got.shape}, expected {ref.shape}")
            if np.issubdtype(got.dtype, np.floating) and not np.isfinite(got).all():
                raise ReplyError(f"array '{key}' has non-finite values")
        metrics = dict(content.metric_records["metrics"])
        app_u = np.asarray(metrics.get("app_u", []), dtype=np.float64)
        k = self.num_classes
        if app_u.shape != (k,):
            raise ReplyError(f"app_u has length {app_u.size}, expected {k}")
        if not np.isfinite(app_u).all() or (app_u < 0).any() or abs(app_u.sum() - 1) > 1e-3:
            raise ReplyError("app_u must be finite, non-negative and sum to 1")
        metrics["partition_id"] = int(metrics.get("partition_id", -1))
        return {"arrays": arrays, "metrics": metrics, "app_u": app_u}

    def aggregation_weights(self, parsed: list[dict[str, Any]]) -> tuple[np.ndarray, dict]:
        n = len(parsed)
        if self.cfg["server"]["weighting"] == "samples":
            sizes = np.array([p["metrics"]["num_labeled"] + p["metrics"]["num_unlabeled"]
                              for p in parsed], dtype=np.float64)
            return sizes / sizes.sum(), {}
        return np.full(n, 1.0 / n), {}

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        parsed, failures = [], []
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                failures.append({"node_id": node, "reason": msg.error.reason})
                continue
            try:
                parsed.append(self.parse_reply(msg))
            except ReplyError as err:
                failures.append({"node_id": node, "reason": str(err)})
        for f in failures:
            log(WARNING, "round %s: reply from node %s dropped: %s", server_round, f["node_id"],
                f["reason"])
        parsed.sort(key=lambda p: p["metrics"]["partition_id"])
        self.last_round.update({"failures": failures, "skipped": False})
        if len(parsed) < self.cfg["fl"]["min_train_clients"]:
            log(WARNING, "round %s: %s valid replies < fl.min_train_clients=%s; global model kept",
                server_round, len(parsed), self.cfg["fl"]["min_train_clients"])
            self.last_round.update({"skipped": True, "clients": [], "dma": None})
            return None, MetricRecord({"valid_replies": len(parsed)})
        weights, diagnostics = self.aggregation_weights(parsed)
        new = self.server_update([p["arrays"] for p in parsed], weights)
        self.last_round["clients"] = [
            client_record(p["metrics"], float(w)) for p, w in zip(parsed, weights)]
        self.last_round["dma"] = diagnostics or None
        return numpy_to_arrays(new), MetricRecord({"valid_replies": len(parsed)})

    def server_update(self, client_arrays: list[dict[str, np.ndarray]],
                      weights: np.ndarray) -> dict[str, np.ndarray]:
        assert self.global_arrays is not None
        s, mu = self.cfg["server"]["lr"], self.cfg["server"]["momentum"]
        new: dict[str, np.ndarray] = {}
        for key, old in self.global_arrays.items():
            if not np.issubdtype(old.dtype, np.floating):      # e.g. num_batches_tracked
                new[key] = np.max([a[key] for a in client_arrays], axis=0).astype(old.dtype)
                continue
            avg = sum(w * a[key].astype(np.float64) for w, a in zip(weights, client_arrays))
            if key.endswith(STAT_SUFFIXES):
                new[key] = avg.astype(old.dtype)
                continue
            step = old.astype(np.float64) - avg
            buf = mu * self.momentum_buffer[key] + step if key in self.momentum_buffer else step
            self.momentum_buffer[key] = buf
            new[key] = (old.astype(np.float64) - s * buf).astype(old.dtype)
        return new


def client_record(metrics: dict[str, Any], weight: float) -> dict[str, Any]:
    """One participating client's entry in metrics.jsonl."""
    rec = {
        "partition_id": metrics["partition_id"],
        "num_labeled": int(metrics.get("num_labeled", 0)),
        "num_unlabeled": int(metrics.get("num_unlabeled", 0)),
        "app_u": [float(v) for v in metrics["app_u"]],
        "app_u_global": [float(v) for v in metrics.get("app_u_global", [])],
        "weight": weight,
        "pseudo_label_accuracy": None,
        "pseudo_label_ratio": float(metrics.get("pseudo_label_ratio", 0.0)),
        "pseudo_label_accuracy_all": metrics.get("pseudo_label_accuracy_all"),
        "labeled_histogram": [int(v) for v in metrics.get("labeled_histogram", [])],
        "loss_sup": float(metrics.get("loss_sup", math.nan)),
        "loss_unsup": float(metrics.get("loss_unsup", math.nan)),
        "train_seconds": float(metrics.get("train_seconds", math.nan)),
    }
    if int(metrics.get("pseudo_label_count", 0)) > 0:
        rec["pseudo_label_accuracy"] = float(metrics["pseudo_label_accuracy"])
    return rec

"""Weighted averaging with server momentum, reproducible sampling by partition id, and per-round
client records. The weights beta are uniform, sample-sized, or chosen by DMA (`dma.enabled`, FedDB);
the method's server side (fssl.methods.base.MethodServer) changes how they are applied, what clients
receive besides the global model, and what the server keeps between rounds.

Server update (SPEC section 2): buf <- mu * buf + (w - sum_m beta_m w_m); w <- w - s * buf, where
any weight the clients do not take (1 - sum beta) stays on the current global model w.
BatchNorm running statistics (norm `bn`) are averaged with the same weights, without momentum.
Every round also logs the gradient diversity sum_k |D_k|^2 / |sum_k D_k|^2 of the client updates
D_k = w_k - w (FedRGD's Eq. 1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fssl.config import clients_per_round
from fssl.methods import method_class
from fssl.methods.dma import dma_weights
from fssl.train import cosine_lr

from . import contract, robust
from .contract import STAT_SUFFIXES, ReplyError, arrays_to_numpy, client_record, numpy_to_arrays


@dataclass
class ServerSetup:
    """What the ServerApp knows about the run when it builds the strategy."""

    node_of: dict[int, int] = field(default_factory=dict)  # partition id -> node id
    partition_sizes: list[tuple[int, int]] | None = None  # (n_l, n_u) of the server's partition
    max_samples: int | None = None  # bound on reported sizes when server.max_samples is null
    simulated: bool = True  # the nodes are this app's own ClientApps (no SuperNodes)
    workers: int = 1  # threads for the defences' numpy work
    # the validation loss of a candidate global model (server.robust.loss_check), and how many
    # candidates it may evaluate at once
    audit: Callable[[dict[str, np.ndarray]], float] | None = None
    audit_workers: int = 1
    method: type | None = None  # the method's class, resolved once by the ServerApp


@dataclass
class RoundRecord:
    """What the strategy did in one round; the round loop hands it to the recorder."""

    round: int
    sampled: list[int]
    lr: float
    clients: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    skipped: bool = True
    dma: dict[str, Any] | None = None
    robust: dict[str, Any] | None = None
    strategy: dict[str, Any] | None = None  # strategy=<name>: which one, weights used
    gradient_diversity: Any = None  # a value, or a callable computed when recorded
    method: dict[str, Any] = field(default_factory=dict)  # what the method's server side did
    federated_evaluation: dict[str, Any] | None = None
    timing: dict[str, float] = field(default_factory=dict)
    loss_check_seconds: float = 0.0  # part of the round's aggregation


class WeightedAverage(FedAvg):
    """Uniform (or sample-weighted) averaging plus server momentum, around the method's server
    side (`self.method`)."""

    def __init__(
        self, cfg: dict[str, Any], num_classes: int, setup: ServerSetup | None = None
    ) -> None:
        fl = cfg["fl"]
        super().__init__(
            fraction_train=fl["fraction_train"],
            fraction_evaluate=fl["fraction_evaluate"],
            min_train_nodes=fl["min_train_clients"],
            min_evaluate_nodes=1,
            min_available_nodes=1,
        )
        setup = setup or ServerSetup()
        self.cfg, self.num_classes, self.setup = cfg, num_classes, setup
        self.method_cls = setup.method or method_class(cfg["method"]["trainer"])
        self.method = self.method_cls.server(cfg, num_classes)
        # dpl_prior=global: the last aggregate's APP-U, sent with the model
        self.global_prior: np.ndarray | None = None
        self.cfg_json = json.dumps(cfg, sort_keys=True)
        self.node_of: dict[int, int] = {}  # partition id -> node id
        self.pids_on: dict[int, list[int]] = {}  # node id -> the partitions it may train
        self.bind_nodes(setup.node_of)
        self.known_sizes = {
            pid: (int(n_l), int(n_u))  # pid -> (n_l, n_u), the server's own
            for pid, (n_l, n_u) in enumerate(setup.partition_sizes or [])
        }
        cap = cfg["server"]["max_samples"]
        self.max_samples = cap if cap is not None else setup.max_samples
        self.global_arrays: dict[str, np.ndarray] | None = None
        # labels_at_server: the model the server trained on its labels from this round's global
        # model, for strategies that average it with the clients' (server_step "parallel")
        self.server_arrays: dict[str, np.ndarray] | None = None
        self.momentum_buffer: dict[str, np.ndarray] = {}
        self.round_record = RoundRecord(round=0, sampled=[], lr=self.lr_for(0))
        self.train_sent: list[Message] = []  # the round's train instructions
        self.driver: Any = self  # what the round loop calls: this, or a Flower wrapper (DP)

    @property
    def server_step(self) -> str:
        """labels_at_server: when the server trains on its labels (fssl.methods.base.MethodServer)."""
        return self.method.step

    def trusted_sizes(self, metrics: dict[str, Any]) -> tuple[int, int]:
        """(n_l, n_u) the aggregation may use for a reply: the partition's own counts, or the
        reported ones clipped to server.max_samples. A reply cannot buy weight by claiming more."""
        pid = metrics["partition_id"]
        if self.cfg["server"]["sizes"] == "partition" and pid in self.known_sizes:
            n_l, n_u = self.known_sizes[pid]
            if (metrics["num_labeled"], metrics["num_unlabeled"]) != (n_l, n_u):
                log(
                    WARNING,
                    "partition %s reports %s labeled / %s unlabeled, its partition holds "
                    "%s / %s: the partition's counts are used",
                    pid,
                    metrics["num_labeled"],
                    metrics["num_unlabeled"],
                    n_l,
                    n_u,
                )
            return n_l, n_u
        cap = self.max_samples if self.max_samples is not None else math.inf
        return int(min(metrics["num_labeled"], cap)), int(min(metrics["num_unlabeled"], cap))

    # -- sampling --------------------------------------------------------------------------
    def bind_nodes(self, node_of: dict[int, int]) -> None:
        """Which node trains each partition; a node may hold several (simulation with fewer
        SuperNodes than clients: each instruction names its partition)."""
        self.node_of = dict(node_of)
        self.pids_on = {}
        for pid, node in sorted(node_of.items()):
            self.pids_on.setdefault(node, []).append(pid)

    def labels_only_round(self, server_round: int) -> bool:
        """Whether this round's clients learn from labels alone: a labels-only method, or a
        warm-up round."""
        unlabeled = self.method_cls.uses_unlabeled
        return not unlabeled or server_round <= self.cfg["train"]["warmup_rounds"]

    def eligible(self, labels_needed: bool) -> list[int]:
        """The partitions a round may sample: all of them, or those holding labels when the
        round needs them (labels at the server: none; at some clients: those)."""
        m = self.cfg["fl"]["num_clients"]
        if not labels_needed or not self.known_sizes:
            return list(range(m))
        return [pid for pid in range(m) if self.known_sizes.get(pid, (1, 0))[0] > 0]

    def sample(
        self, server_round: int, fraction: float, labels_needed: bool | None = None
    ) -> list[int]:
        """Partition ids for this round: seeded by (seed, round), independent of node ids, among
        the partitions with something to learn this round (`labels_needed`: default, whether
        the round is labels-only)."""
        m = self.cfg["fl"]["num_clients"]
        k = clients_per_round(self.cfg, fraction)
        rng = np.random.default_rng([self.cfg["seed"], server_round, 7])
        if labels_needed is None:
            labels_needed = self.labels_only_round(server_round)
        pool = self.eligible(labels_needed)
        if len(pool) < m:  # some partitions hold nothing this round can learn from
            k = min(k, len(pool))
            fixed = [p for p in sorted(set(self.cfg["fl"].get("always_sample", []))) if p in pool]
            fixed = fixed[:k]
            rest = np.setdiff1d(pool, fixed)
            drawn = rng.choice(rest, k - len(fixed), replace=False) if k > len(fixed) else []
            return sorted([*fixed, *(int(i) for i in drawn)])
        fixed = sorted(set(self.cfg["fl"].get("always_sample", [])))[:k]
        if not fixed:
            return sorted(int(i) for i in rng.choice(m, k, replace=False))
        rest = np.setdiff1d(np.arange(m), fixed)  # the others drawn as usual among the rest
        return sorted([*fixed, *(int(i) for i in rng.choice(rest, k - len(fixed), replace=False))])

    def _messages(
        self, pids: list[int], arrays: ArrayRecord, config: ConfigRecord, message_type: str
    ) -> list[Message]:
        server_round = int(config[contract.ROUND])
        return [
            Message(
                content=RecordDict(
                    {
                        "arrays": arrays,
                        "config": ConfigRecord({**config, contract.PARTITION: p}),
                        **self.extra_records(p, server_round, message_type),
                    }
                ),
                dst_node_id=self.node_of[p],
                message_type=message_type,
            )
            for p in pids
            if p in self.node_of  # a deployment's partition whose node has not answered yet
        ]

    def extra_records(self, pid: int, server_round: int, message_type: str) -> dict[str, Any]:
        """Records for one client besides the global arrays and the config: the arrays the
        method's server side sends with a train instruction."""
        if message_type != MessageType.TRAIN:
            return {}
        sent = self.method.records_for(pid, server_round)
        return {name: numpy_to_arrays(arrays) for name, arrays in sent.items()}

    def lr_for(self, server_round: int) -> float:
        tr = self.cfg["train"]
        return cosine_lr(tr["lr"], server_round, self.cfg["num_rounds"], tr["lr_schedule"])

    def loss_tolerance(self, server_round: int | None) -> float:
        """The loss check's fraction for round t: `server.robust.loss_check`, times lr_t / lr_0
        with `loss_check_scale: lr` (an update's effect on the loss is proportional to its step,
        to first order, so a fixed fraction lets harmful updates through once the steps are
        small: measured, a sign flip passed in the last rounds of a cosine schedule)."""
        rb = self.cfg["server"]["robust"]
        tol = float(rb["loss_check"])
        if rb.get("loss_check_scale", "lr") == "lr" and server_round is not None:
            tol *= self.lr_for(server_round) / float(self.cfg["train"]["lr"])
        return tol

    def lambda_u_for(self, server_round: int) -> float:
        """Unlabeled loss weight of round t: 0 during the warm-up rounds, lambda_u after."""
        tr = self.cfg["train"]
        return 0.0 if server_round <= tr["warmup_rounds"] else float(tr["lambda_u"])

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        config[contract.ROUND] = server_round
        config[contract.LR] = self.lr_for(server_round)
        config[contract.LAMBDA_U] = self.lambda_u_for(server_round)
        config[contract.RUN_CONFIG] = self.cfg_json
        if self.global_prior is not None and self.cfg.get("dpl_prior") == "global":
            config[contract.GLOBAL_PRIOR] = [float(x) for x in self.global_prior]
        return config

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.global_arrays = arrays_to_numpy(arrays)
        pids = self.sample(server_round, self.cfg["fl"]["fraction_train"])
        self.begin_round(server_round, pids)
        # kept: once pushed, each carries its message id, which its reply (an error made by the
        # SuperLink for a node gone silent included) answers
        self.train_sent = self._messages(
            pids, arrays, self.round_config(server_round, config), MessageType.TRAIN
        )
        return self.train_sent

    def begin_round(self, server_round: int, sampled: list[int]) -> RoundRecord:
        """A fresh record for the round whose instructions go out now."""
        self.round_record = RoundRecord(
            round=server_round, sampled=sampled, lr=self.lr_for(server_round)
        )
        self.method.notes = self.round_record.method
        return self.round_record

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        fraction = self.cfg["fl"]["fraction_evaluate"]
        if fraction == 0:
            return []
        pids = self.sample(server_round + 100003, fraction, labels_needed=True)
        return self._messages(
            pids, arrays, self.round_config(server_round, config), MessageType.EVALUATE
        )

    def state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """Arrays and JSON state a checkpoint needs (the method's server side adds its caches)."""
        arrays = {"momentum": dict(self.momentum_buffer), **self.method.state()}
        if self.global_prior is not None:
            arrays["global_prior"] = {"p": self.global_prior}
        return arrays, {}

    def load_state(self, arrays: dict[str, dict[str, np.ndarray]], state: dict[str, Any]) -> None:
        self.momentum_buffer = dict(arrays.get("momentum", {}))
        self.global_prior = arrays.get("global_prior", {}).get("p")
        self.method.load_state(arrays)

    # -- replies ---------------------------------------------------------------------------
    def parse_reply(self, msg: Message) -> dict[str, Any]:
        """Arrays, metrics and APP-U of one train reply, checked (strategy/contract.py)."""
        assert self.global_arrays is not None
        return contract.parse_train_reply(
            msg, self.global_arrays, self.num_classes, self.pids_on.get(msg.metadata.src_node_id)
        )

    def aggregation_weights(
        self, parsed: list[dict[str, Any]], server_round: int | None = None
    ) -> tuple[np.ndarray, dict]:
        """beta on the simplex: DMA on the clients' APP-U, or uniform / sample-sized. In a
        warm-up round every client trained on its labels alone, so every method weighs the
        updates as labels-only FedAvg does (no DMA, n_m = labels): the warm-up is the same run
        for every method of a seed, and a paired comparison starts from one model."""
        n = len(parsed)
        d = self.cfg["dma"]
        warmup = server_round is not None and server_round <= self.cfg["train"]["warmup_rounds"]
        if d["enabled"] and not warmup:
            res = dma_weights(
                np.stack([p["app_u"] for p in parsed]),
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
                    self.round_record.round,
                    res.at_cap,
                    n,
                    d["cap"] / n,
                )
            return res.weights, {
                "mode": d["mode"],
                "loss_uniform": res.loss_uniform,
                "loss_weights": res.loss,
                "weight_entropy": res.entropy,
                "weights": res.weights.tolist(),
                "cap": d["cap"],
                "at_cap": res.at_cap,
            }
        if self.weighting(warmup) == "samples":
            # n_m: the examples client m trains on (its labels alone for labels-only training,
            # and for a labeled client of labels_at_partial_clients, whose unlabeled set is its
            # labeled images again, for APP-U)
            unl = self.method_cls.uses_unlabeled and not warmup
            partial = (self.cfg.get("scenario") or {}).get("name") == "labels_at_partial_clients"
            sizes = np.array(
                [
                    n_l + (unl and not (partial and n_l > 0)) * n_u
                    for n_l, n_u in (self.trusted_sizes(p["metrics"]) for p in parsed)
                ],
                dtype=np.float64,
            )
            return sizes / max(sizes.sum(), 1.0), {}
        return np.full(n, 1.0 / n), {}

    def instructed(self) -> dict[str, tuple[int, int]]:
        """Message id -> (partition, node) of the round's train instructions once pushed."""
        out = {}
        for m in self.train_sent:
            config = m.content.config_records["config"]
            out[m.metadata.message_id] = (int(config[contract.PARTITION]), m.metadata.dst_node_id)
        return out

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        record = self.round_record
        sampled = record.sampled
        replies = list(replies)
        if not sampled and not replies:  # no client had anything to learn (labels at the server)
            record.skipped, record.clients = False, []
            return None, MetricRecord({"valid_replies": 0})
        parsed, failures, bad = [], [], []
        for msg in replies:
            try:
                if msg.has_error():
                    reason, trace = contract.error_of(msg)
                    raise ReplyError(f"client error: {reason}", trace)
                reply = self.parse_reply(msg)
                if sampled and reply["metrics"]["partition_id"] not in sampled:
                    raise ReplyError(
                        f"partition {reply['metrics']['partition_id']} was not sampled this round"
                    )
                if any(
                    p["metrics"]["partition_id"] == reply["metrics"]["partition_id"] for p in parsed
                ):
                    raise ReplyError(
                        f"a second reply for partition "
                        f"{reply['metrics']['partition_id']} this round"
                    )
                parsed.append(reply)
            except ReplyError as err:
                bad.append((msg, err))
        answered = {p["metrics"]["partition_id"] for p in parsed}
        instructed = self.instructed()
        for msg, err in bad:
            # charged to the partition whose instruction it answers: a SuperLink's own error
            # reply has the SuperLink, not the node, as its source
            pid, node = instructed.get(msg.metadata.reply_to_message_id, (None, None))
            if pid is None or pid in answered:  # else to a sampled partition of its source
                node = msg.metadata.src_node_id
                pid = next(
                    (
                        q
                        for q in self.pids_on.get(node, [])
                        if q not in answered and (not sampled or q in sampled)
                    ),
                    None,
                )
            answered.add(pid)
            failure = {"partition_id": pid, "node_id": node, "reason": str(err.args[0])}
            if len(err.args) > 1 and err.args[1]:
                failure["traceback"] = err.args[1]  # kept in client_errors.log, not metrics
            failures.append(failure)
        for pid in sampled:
            if pid not in answered:
                node = self.node_of.get(pid)
                failures.append(
                    {
                        "partition_id": pid,
                        "node_id": node,
                        "reason": "no node holds this partition yet"
                        if node is None
                        else "no reply within fl.round_timeout (node failed or gone)",
                    }
                )
        for f in failures:
            log(
                WARNING,
                "round %s: reply of partition %s (node %s) dropped: %s",
                server_round,
                f["partition_id"],
                f["node_id"],
                f["reason"],
            )
        parsed.sort(key=lambda p: p["metrics"]["partition_id"])
        record.failures, record.skipped = failures, False
        if len(parsed) < self.cfg["fl"]["min_train_clients"]:
            log(
                WARNING,
                "round %s: %s valid replies < fl.min_train_clients=%s; global model kept",
                server_round,
                len(parsed),
                self.cfg["fl"]["min_train_clients"],
            )
            record.skipped, record.clients = True, []
            record.dma = record.gradient_diversity = None
            return None, MetricRecord({"valid_replies": len(parsed)})
        weights, diagnostics = self.aggregation_weights(parsed, server_round)
        weights = self.without_idle_clients(parsed, weights, server_round)
        client_arrays = [p["arrays"] for p in parsed]
        # a diagnostic: computed (on one thread) when the round is recorded, after the next
        # round's instructions have gone out, instead of on the round's critical path
        old = self.global_arrays
        record.gradient_diversity = lambda: gradient_diversity(old, client_arrays)
        coefficients = self.coefficients(server_round, parsed, weights)
        new = self.server_update(client_arrays, coefficients)
        record.clients = [
            client_record(p["metrics"], float(w)) for p, w in zip(parsed, coefficients)
        ]
        record.dma = diagnostics or None
        if self.cfg.get("dpl_prior") == "global":  # an all-idle round keeps the last one
            prior = self.aggregated_app_u(parsed, coefficients)
            self.global_prior = prior if prior is not None else self.global_prior
        self.after_aggregate(server_round, parsed)
        return numpy_to_arrays(new), MetricRecord({"valid_replies": len(parsed)})

    def weighting(self, warmup: bool) -> str:
        """uniform or samples: `server.weighting`, or in a warm-up round the regime's warm-up
        weighting (`server.warmup_weighting`), so that a row that changes only how the
        semi-supervised rounds average shares the warm-up of the rows it is compared with."""
        server = self.cfg["server"]
        return (server.get("warmup_weighting") if warmup else None) or server["weighting"]

    def aggregated_app_u(
        self, parsed: list[dict[str, Any]], coefficients: np.ndarray
    ) -> np.ndarray | None:
        """`dpl_prior: global`: sum_m beta_m p_bar_m over the clients the round's defences kept
        (an APP-U is a reply's claim, sent on to every client), beta their coefficients
        renormalised: the federation's APP-U as the aggregate weighs it (what DMA brings closest
        to uniform); the coordinate-wise median or trimmed mean under those rules. None when no
        client kept any weight."""
        kept = (self.round_record.robust or {}).get("selected")
        idx = list(range(len(parsed))) if kept is None else list(kept)
        weights = np.asarray(coefficients, dtype=np.float64)[idx]
        if not idx or float(weights.sum()) <= 0:
            return None
        stacked = np.stack([parsed[i]["app_u"] for i in idx])
        rb = self.cfg["server"]["robust"]
        if rb["rule"] in ("median", "trimmed_mean"):
            combined = robust.combine(stacked, weights, rb["rule"], rb["trim"])
            return combined / combined.sum()
        return (weights / weights.sum()) @ stacked

    def without_idle_clients(
        self, parsed: list[dict[str, Any]], weights: np.ndarray, server_round: int
    ) -> np.ndarray:
        """Clients the method's server side sits out after the warm-up (`sits_out`) leave the
        aggregate and the others share their weight; with none left the global model stays."""
        if server_round <= self.cfg["train"]["warmup_rounds"]:
            return weights
        idle = np.array([self.method.sits_out(p["metrics"]) for p in parsed], dtype=bool)
        if not idle.any():
            return weights
        kept = np.where(idle, 0.0, weights)
        return kept / kept.sum() if kept.sum() > 0 else kept

    def coefficients(
        self, server_round: int, parsed: list[dict[str, Any]], weights: np.ndarray
    ) -> np.ndarray:
        """Each client's coefficient in the aggregate (the method's server side decides); what
        they leave stays on the global model."""
        return self.method.coefficients(server_round, [p["metrics"] for p in parsed], weights)

    def after_aggregate(self, server_round: int, parsed: list[dict[str, Any]]) -> None:
        """Server-side caches built from this round's valid replies (the method's)."""
        self.method.after_aggregate(server_round, parsed)

    def residual_base(self, key: str) -> np.ndarray:
        """Where the weight the clients leave (1 - sum beta) goes: the global model, or the
        server's own model when it trains in parallel (FedRGD's w_s, labels_at_server)."""
        assert self.global_arrays is not None
        if self.server_step == "parallel" and self.server_arrays is not None:
            return self.server_arrays[key]
        return self.global_arrays[key]

    def defend(
        self, client_arrays: list[dict[str, np.ndarray]], weights: np.ndarray
    ) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
        """`server.robust`'s defences and selection (strategy/robust.py: defend); what they did
        goes to metrics.jsonl as `robust`."""
        assert self.global_arrays is not None
        rec, rb = self.round_record, self.cfg["server"]["robust"]
        tolerance = self.loss_tolerance(rec.round) if rb["loss_check"] is not None else None
        client_arrays, weights, rec.robust, rec.loss_check_seconds = robust.defend(
            self.global_arrays,
            client_arrays,
            weights,
            rb,
            rec.round,
            tolerance,
            self.setup.workers,
            self.setup.audit,
            self.setup.audit_workers,
            self.server_arrays if self.server_step == "parallel" else None,
        )
        return client_arrays, weights

    def server_update(
        self, client_arrays: list[dict[str, np.ndarray]], weights: np.ndarray
    ) -> dict[str, np.ndarray]:
        assert self.global_arrays is not None
        s, mu = self.cfg["server"]["lr"], self.cfg["server"]["momentum"]
        client_arrays, weights = self.defend(client_arrays, weights)
        rule, trim = self.cfg["server"]["robust"]["rule"], self.cfg["server"]["robust"]["trim"]
        new: dict[str, np.ndarray] = {}
        for key, old in self.global_arrays.items():
            if not np.issubdtype(old.dtype, np.floating):  # e.g. num_batches_tracked
                new[key] = np.max([a[key] for a in client_arrays], axis=0).astype(old.dtype)
                continue
            if rule in ("median", "trimmed_mean"):  # no weights: DMA cannot apply
                avg = robust.combine(
                    np.stack([a[key].astype(np.float64) for a in client_arrays]),
                    weights,
                    rule,
                    trim,
                )
            else:
                avg = robust.weighted_mean(
                    self.residual_base(key), [a[key] for a in client_arrays], weights
                )
            if key.endswith(STAT_SUFFIXES):
                new[key] = avg.astype(old.dtype)
                continue
            step = old.astype(np.float64) - avg
            buf = mu * self.momentum_buffer[key] + step if key in self.momentum_buffer else step
            self.momentum_buffer[key] = buf
            new[key] = (old.astype(np.float64) - s * buf).astype(old.dtype)
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

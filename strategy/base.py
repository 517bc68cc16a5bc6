"""The method's strategy (`strategy=method`): a Flower message-API strategy whose round is three
parts, each in its own module, around the method's server side (fssl.methods.base.MethodServer):
- reply intake (strategy/intake.py): replies parsed and checked, failures charged to partitions;
- a weighting policy (strategy/weighting.py): the weights beta of the valid replies (uniform, by
  samples, DMA, or a user's), which the method's server side turns into its coefficients;
- the update step (strategy/update.py): `server.robust`'s defences and rule, then server momentum.
Clients are sampled by partition id, seeded (strategy/sampling.py); each instruction carries only
the client's part (fssl/instruction.py). Every round also logs the gradient diversity of the
client updates (FedRGD's Eq. 1).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fssl.instruction import Instruction, client_config
from fssl.methods import method_class
from fssl.train import round_lambda_u, round_lr

from . import contract
from .contract import arrays_to_numpy, client_record, numpy_to_arrays
from .intake import ReplyIntake
from .sampling import Sampler, warmup
from .update import ServerUpdate, gradient_diversity
from .weighting import policies


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
    dma: dict[str, Any] | None = None  # DMA's diagnostics (a weighting policy's notes)
    robust: dict[str, Any] | None = None
    strategy: dict[str, Any] | None = None  # strategy=<name>: which one, weights used
    gradient_diversity: Any = None  # a value, or a callable computed when recorded
    method: dict[str, Any] = field(default_factory=dict)  # what the method's server side did
    federated_evaluation: dict[str, Any] | None = None
    timing: dict[str, float] = field(default_factory=dict)
    loss_check_seconds: float = 0.0  # part of the round's aggregation


class MethodStrategy(FedAvg):
    """Sampling and instructions, then intake, weighting and update, around the method's server
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
        self.intake = ReplyIntake(cfg, num_classes, setup.partition_sizes, setup.max_samples)
        self.intake.bind_nodes(setup.node_of)
        unlabeled = self.method_cls.uses_unlabeled
        self.sampler = Sampler(cfg, self.intake.known_sizes, unlabeled)
        self.warmup_weighting, self.weighting = policies(cfg, unlabeled)
        self.update = ServerUpdate(cfg, setup.workers, setup.audit, setup.audit_workers)
        self.client_json = json.dumps(client_config(cfg), sort_keys=True)
        # dpl_prior=global: the last aggregate's APP-U, sent with the model
        self.global_prior: np.ndarray | None = None
        self.global_arrays: dict[str, np.ndarray] | None = None
        # labels_at_server: the model the server trained on its labels from this round's global
        # model, where the weight the clients leave goes (server_step "parallel", FedRGD)
        self.server_arrays: dict[str, np.ndarray] | None = None
        self.round_record = RoundRecord(round=0, sampled=[], lr=round_lr(cfg, 0))
        self.train_sent: list[Message] = []  # the round's train instructions
        self.driver: Any = self  # what the round loop calls: this, or a Flower wrapper (DP)

    @property
    def server_step(self) -> str:
        """labels_at_server: when the server trains on its labels (fssl.methods.base.MethodServer)."""
        return self.method.step

    # -- instructions ----------------------------------------------------------------------
    def client_terms(self) -> dict[str, Any]:
        """A strategy's terms for the clients' loss (FedProx's `proximal-mu`); none here."""
        return {}

    def instruction(self, server_round: int, pid: int, message_type: str) -> Instruction:
        """What partition `pid` is told: the round's schedule, the method's arrays for it (train
        instructions), a strategy's client terms, the aggregated APP-U (dpl_prior=global)."""
        train = message_type == MessageType.TRAIN
        prior = self.global_prior if self.cfg.get("dpl_prior") == "global" else None
        return Instruction(
            lr=round_lr(self.cfg, server_round),
            round=server_round,
            lambda_u=round_lambda_u(self.cfg, server_round),
            partition=pid,
            received=self.method.records_for(pid, server_round) if train else {},
            terms=self.client_terms(),
            global_prior=[float(x) for x in prior] if prior is not None else None,
        )

    def messages(
        self, pids: list[int], arrays: ArrayRecord, server_round: int, message_type: str
    ) -> list[Message]:
        node_of = self.intake.node_of
        return [
            Message(
                content=contract.instruction_content(
                    arrays, self.instruction(server_round, p, message_type), self.client_json
                ),
                dst_node_id=node_of[p],
                message_type=message_type,
            )
            for p in pids
            if p in node_of  # a deployment's partition whose node has not answered yet
        ]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.global_arrays = arrays_to_numpy(arrays)
        sampled = self.sampler.sample(server_round, self.cfg["fl"]["fraction_train"])
        pool = self.sampler.eligible(self.sampler.labels_only_round(server_round))
        pids = self.method.clients(server_round, pool, sampled)
        self.begin_round(server_round, pids)
        # kept: once pushed, each carries its message id, which its reply (an error made by the
        # SuperLink for a node gone silent included) answers
        self.train_sent = self.messages(pids, arrays, server_round, MessageType.TRAIN)
        return self.train_sent

    def begin_round(self, server_round: int, sampled: list[int]) -> RoundRecord:
        """A fresh record for the round whose instructions go out now."""
        lr = round_lr(self.cfg, server_round)
        self.round_record = RoundRecord(round=server_round, sampled=sampled, lr=lr)
        self.method.notes = self.round_record.method
        return self.round_record

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        fraction = self.cfg["fl"]["fraction_evaluate"]
        if fraction == 0:
            return []
        pids = self.sampler.sample(server_round + 100003, fraction, labels_needed=True)
        return self.messages(pids, arrays, server_round, MessageType.EVALUATE)

    # -- checkpoints -----------------------------------------------------------------------
    def state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """Arrays and JSON state a checkpoint needs: the update step's, the method's server
        side's caches, the aggregated APP-U."""
        arrays, state = self.update.state()
        arrays.update(self.method.state())
        if self.global_prior is not None:
            arrays["global_prior"] = {"p": self.global_prior}
        return arrays, state

    def load_state(self, arrays: dict[str, dict[str, np.ndarray]], state: dict[str, Any]) -> None:
        self.update.load_state(arrays, state)
        self.global_prior = arrays.get("global_prior", {}).get("p")
        self.method.load_state(arrays)

    # -- the round's replies ---------------------------------------------------------------
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        record, replies = self.round_record, list(replies)
        if not record.sampled and not replies:  # no client had anything to learn
            record.skipped, record.clients = False, []
            return None, MetricRecord({"valid_replies": 0})
        assert self.global_arrays is not None
        old = self.global_arrays
        parsed, record.failures = self.intake.take(
            replies, record.sampled, self.train_sent, old, server_round
        )
        record.skipped = False
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
        coefficients = self.coefficients(server_round, parsed)
        # a diagnostic: computed (on one thread) when the round is recorded, after the next
        # round's instructions have gone out, instead of on the round's critical path
        client_arrays = [p["arrays"] for p in parsed]
        record.gradient_diversity = lambda: gradient_diversity(old, client_arrays)
        residual = self.server_arrays if self.server_step == "parallel" else None
        new = self.method.after_update(
            server_round, old, self.update(old, parsed, coefficients, record, residual)
        )
        record.clients = [
            client_record(p["metrics"], float(w)) for p, w in zip(parsed, coefficients)
        ]
        if self.cfg.get("dpl_prior") == "global":  # an all-idle round keeps the last one
            prior = self.aggregated_app_u(parsed, coefficients)
            self.global_prior = prior if prior is not None else self.global_prior
        self.method.after_aggregate(server_round, parsed)
        return numpy_to_arrays(new), MetricRecord({"valid_replies": len(parsed)})

    def coefficients(self, server_round: int, parsed: list[dict[str, Any]]) -> np.ndarray:
        """Each client's coefficient in the aggregate: the round's weighting policy (the warm-up's
        in a warm-up round), without the clients the method sits out, as the method's server
        side applies them. What they leave stays on the global (or server) model."""
        warm = warmup(self.cfg, server_round)
        policy = self.warmup_weighting if warm else self.weighting
        policy.notes = None
        weights = policy.weights(parsed, server_round)
        self.round_record.dma = policy.notes  # DMA's diagnostics (a policy's notes)
        if not warm:  # `sits_out` clients leave; the others share their weight
            idle = np.array([self.method.sits_out(p["metrics"]) for p in parsed], dtype=bool)
            if idle.any():
                kept = np.where(idle, 0.0, weights)
                weights = kept / kept.sum() if kept.sum() > 0 else kept
        return self.method.coefficients(server_round, parsed, weights)

    def aggregated_app_u(
        self, parsed: list[dict[str, Any]], coefficients: np.ndarray
    ) -> np.ndarray | None:
        """`dpl_prior: global`: sum_m beta_m p_bar_m over the clients the round's defences kept
        (an APP-U is a reply's claim, sent on to every client), beta their coefficients
        renormalised: the federation's APP-U as the aggregate weighs it (what DMA brings closest
        to uniform); an unweighted rule's own combination (the median). None when no client kept
        any weight."""
        kept = (self.round_record.robust or {}).get("selected")
        idx = list(range(len(parsed))) if kept is None else list(kept)
        weights = np.asarray(coefficients, dtype=np.float64)[idx]
        if not idx or float(weights.sum()) <= 0:
            return None
        stacked = np.stack([parsed[i]["app_u"] for i in idx])
        rule = self.update.rule
        if not rule.weighted:
            combined = rule.combine(np.zeros_like(stacked[0]), list(stacked), weights)
            return combined / combined.sum()
        return (weights / weights.sum()) @ stacked

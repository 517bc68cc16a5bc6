"""Reply intake: a round's train replies parsed and checked (strategy/contract.py), each failure
charged to the partition it belongs to, and the sizes a reply may weigh by. Replies come from
SuperNodes that may be other people's machines: nothing here trusts them."""

from __future__ import annotations

import math
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from . import contract
from .contract import ReplyError


class ReplyIntake:
    """Which node holds which partition, the server's own partition sizes, and a round's replies
    turned into valid ones (`arrays`, `metrics`, `app_u`, `sizes` each) and failures."""

    def __init__(
        self,
        cfg: dict[str, Any],
        num_classes: int,
        partition_sizes: list[tuple[int, int]] | None = None,
        max_samples: int | None = None,
    ) -> None:
        self.cfg, self.num_classes = cfg, num_classes
        self.node_of: dict[int, int] = {}  # partition id -> node id
        self.pids_on: dict[int, list[int]] = {}  # node id -> the partitions it may train
        self.known_sizes = {  # pid -> (n_l, n_u), the server's own
            pid: (int(n_l), int(n_u)) for pid, (n_l, n_u) in enumerate(partition_sizes or [])
        }
        cap = cfg["server"]["max_samples"]
        self.max_samples = cap if cap is not None else max_samples

    def bind_nodes(self, node_of: dict[int, int]) -> None:
        """Which node trains each partition; a node may hold several (simulation with fewer
        SuperNodes than clients: each instruction names its partition)."""
        self.node_of = dict(node_of)
        self.pids_on = {}
        for pid, node in sorted(node_of.items()):
            self.pids_on.setdefault(node, []).append(pid)

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

    def take(
        self,
        replies: list[Message],
        sampled: list[int],
        sent: list[Message],
        global_arrays: dict[str, np.ndarray],
        server_round: int,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The round's valid replies, by partition, and its failures: an error reply, a reply
        that fails its checks, a second reply for a partition, a partition that never answered."""
        parsed, bad = [], []
        for msg in replies:
            try:
                parsed.append(self.checked(msg, sampled, parsed, global_arrays))
            except ReplyError as err:
                bad.append((msg, err))
        answered = {p["metrics"]["partition_id"] for p in parsed}
        failures = self.charged(bad, answered, sampled, sent) + self.silent(answered, sampled)
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
        return parsed, failures

    def checked(
        self,
        msg: Message,
        sampled: list[int],
        parsed: list[dict[str, Any]],
        global_arrays: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        """One reply parsed and checked against the round; raises ReplyError."""
        if msg.has_error():
            reason, trace = contract.error_of(msg)
            raise ReplyError(f"client error: {reason}", trace)
        reply = contract.parse_train_reply(
            msg, global_arrays, self.num_classes, self.pids_on.get(msg.metadata.src_node_id)
        )
        pid = reply["metrics"]["partition_id"]
        if sampled and pid not in sampled:
            raise ReplyError(f"partition {pid} was not sampled this round")
        if any(p["metrics"]["partition_id"] == pid for p in parsed):
            raise ReplyError(f"a second reply for partition {pid} this round")
        reply["sizes"] = self.trusted_sizes(reply["metrics"])
        return reply

    def charged(
        self,
        bad: list[tuple[Message, ReplyError]],
        answered: set[int],
        sampled: list[int],
        sent: list[Message],
    ) -> list[dict[str, Any]]:
        """A failure per bad reply, charged to the partition whose instruction it answers: a
        SuperLink's own error reply has the SuperLink, not the node, as its source."""
        instructed = {  # message id -> (partition, node) of the round's train instructions
            m.metadata.message_id: (
                int(m.content.config_records["config"][contract.PARTITION]),
                m.metadata.dst_node_id,
            )
            for m in sent
        }
        failures = []
        for msg, err in bad:
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
        return failures

    def silent(self, answered: set[int], sampled: list[int]) -> list[dict[str, Any]]:
        """A failure per sampled partition that sent nothing."""
        out = []
        for pid in sampled:
            if pid not in answered:
                node = self.node_of.get(pid)
                reason = (
                    "no node holds this partition yet"
                    if node is None
                    else "no reply within fl.round_timeout (node failed or gone)"
                )
                out.append({"partition_id": pid, "node_id": node, "reason": reason})
        return out

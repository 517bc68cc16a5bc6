"""Weighted averaging with server momentum, reproducible sampling by partition id, and per-round
client records. The weights beta are uniform, sample-sized, or chosen by DMA (`dma.enabled`, FedDB);
subclasses change how they are applied (FedRGD: groups) or what clients receive (FedMatch: helpers).

Server update (SPEC section 2): buf <- mu * buf + (w - sum_m beta_m w_m); w <- w - s * buf, where
any weight the clients do not take (1 - sum beta) stays on the current global model w.
BatchNorm running statistics (norm `bn`) are averaged with the same weights, without momentum.
Every round also logs the gradient diversity sum_k |D_k|^2 / |sum_k D_k|^2 of the client updates
D_k = w_k - w (FedRGD's Eq. 1).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fssl.dma import dma_weights
from fssl.methods import TRAINERS
from fssl.train import cosine_lr

from . import robust

STAT_SUFFIXES = ("running_mean", "running_var")


class ReplyError(ValueError):
    """A client reply cannot be used; the message says why."""


NPY_DESCR = re.compile(rb"'descr': *'([^']+)'")


def array_to_numpy(array: Array) -> np.ndarray:
    """Flower's Array.numpy() reads each array's .npy header with ast.literal_eval (about a
    third of a paper round's server time for WRN-28-2's 160 arrays x 10 replies); the shape is
    in the Array, so only the dtype is read from the header, and the data are copied out once."""
    data = array.data
    if array.stype != "numpy.ndarray" or data[:6] != b"\x93NUMPY":
        return array.numpy()
    size = 2 if data[6] == 1 else 4                      # header length field: v1 2 bytes, v2+ 4
    start = 8 + size
    offset = start + int.from_bytes(data[8:start], "little")
    header = data[start:offset]
    descr = NPY_DESCR.search(header)
    if descr is None or b"'fortran_order': False" not in header:
        return array.numpy()
    dtype = np.dtype(descr.group(1).decode())
    count = int(np.prod(array.shape, dtype=np.int64))
    return np.frombuffer(data, dtype, count, offset).reshape(array.shape).copy()


def arrays_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: array_to_numpy(v) for k, v in record.items()}


def arrays_to_torch(record: ArrayRecord) -> dict[str, Any]:
    """ArrayRecord.to_torch_state_dict() through the fast conversion."""
    import torch

    return {k: torch.from_numpy(array_to_numpy(v)) for k, v in record.items()}


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
        self.pids_on: dict[int, list[int]] = {}    # node id -> the partitions it may train
        self.global_arrays: dict[str, np.ndarray] | None = None
        self.momentum_buffer: dict[str, np.ndarray] = {}
        self.last_round: dict[str, Any] = {}
        self.driver: Any = self     # what the round loop calls: this, or a Flower wrapper (DP)
        self.known_sizes: dict[int, tuple[int, int]] = {}   # pid -> (n_l, n_u), the server's own
        self.max_samples: int | None = cfg["server"]["max_samples"]
        # the validation loss of a candidate global model (server.robust.loss_check), set by the
        # ServerApp from its validation split
        self.audit: Callable[[dict[str, np.ndarray]], float] | None = None
        self.loss_check_seconds = 0.0              # this round's, part of its aggregation
        self.audit_workers = 1                     # candidates the loss check evaluates at once
        self.workers = 1                           # threads for the defences' numpy work

    def set_partition_sizes(self, labeled: list[int], unlabeled: list[int]) -> None:
        """The sizes of the server's own partition (`server.sizes=partition`)."""
        self.known_sizes = {pid: (int(n_l), int(n_u))
                            for pid, (n_l, n_u) in enumerate(zip(labeled, unlabeled))}

    def trusted_sizes(self, metrics: dict[str, Any]) -> tuple[int, int]:
        """(n_l, n_u) the aggregation may use for a reply: the partition's own counts, or the
        reported ones clipped to server.max_samples. A reply cannot buy weight by claiming more."""
        pid = metrics["partition_id"]
        if self.cfg["server"]["sizes"] == "partition" and pid in self.known_sizes:
            n_l, n_u = self.known_sizes[pid]
            if (metrics["num_labeled"], metrics["num_unlabeled"]) != (n_l, n_u):
                log(WARNING, "partition %s reports %s labeled / %s unlabeled, its partition holds "
                    "%s / %s: the partition's counts are used", pid, metrics["num_labeled"],
                    metrics["num_unlabeled"], n_l, n_u)
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

    def sample(self, server_round: int, fraction: float) -> list[int]:
        """Partition ids for this round: seeded by (seed, round), independent of node ids."""
        m = self.cfg["fl"]["num_clients"]
        k = max(1, min(m, round(fraction * m)))
        rng = np.random.default_rng([self.cfg["seed"], server_round, 7])
        fixed = sorted(set(self.cfg["fl"].get("always_sample", [])))[:k]
        if not fixed:
            return sorted(int(i) for i in rng.choice(m, k, replace=False))
        rest = np.setdiff1d(np.arange(m), fixed)      # the others drawn as usual among the rest
        return sorted([*fixed, *(int(i) for i in rng.choice(rest, k - len(fixed), replace=False))])

    def _messages(self, pids: list[int], arrays: ArrayRecord, config: ConfigRecord,
                  message_type: str) -> list[Message]:
        server_round = int(config["server-round"])
        return [Message(content=RecordDict({"arrays": arrays,
                                            "config": ConfigRecord({**config, "partition-id": p}),
                                            **self.extra_records(p, server_round, message_type)}),
                        dst_node_id=self.node_of[p], message_type=message_type)
                for p in pids]

    def extra_records(self, pid: int, server_round: int, message_type: str) -> dict[str, Any]:
        """Records for one client besides the global arrays and the config (FedMatch: helpers)."""
        return {}

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
        config["server-round"] = server_round
        config["lr"] = self.lr_for(server_round)
        config["lambda-u"] = self.lambda_u_for(server_round)
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

    # -- rounds ----------------------------------------------------------------------------
    def run(self, grid: Grid, arrays: ArrayRecord, first_round: int,
            evaluate_fn: Callable[[int, ArrayRecord], Any],
            after_round: Callable[[int, ArrayRecord], None],
            evaluate_first: bool = False) -> ArrayRecord:
        """Rounds `first_round`..num_rounds (Strategy.start always begins at 1; a resumed run
        does not): train, aggregate, optional federated evaluation, central evaluation, hook.
        Round t + 1's instructions go out before round t's global model is evaluated and
        checkpointed, so the server's own work overlaps the clients' (the results are the same:
        nothing in round t + 1 depends on the evaluation); so does the evaluation of the model
        the run starts from (`evaluate_first`: round first_round - 1)."""
        timeout = self.cfg["fl"]["round_timeout"]
        last = self.cfg["num_rounds"]
        after_previous = 0.0
        overlap = not getattr(grid, "synchronous", False)    # in-process: nothing to overlap
        clock = Stopwatch()
        pending = self.push_train(grid, first_round, arrays) if first_round <= last else None
        self.first_push_time = time.time()         # the start-up timeline's "first round sent"
        if evaluate_first:
            evaluate_fn(first_round - 1, arrays)
        for server_round in range(first_round, last + 1):
            clock.lap("configure")
            replies = collect(grid, pending, timeout)
            clock.lap("communicate")       # waiting for the clients' replies
            self.last_round.update({"clients": [], "failures": [], "skipped": True})
            new, _ = self.driver.aggregate_train(server_round, replies)
            if new is not None:
                arrays = new
            clock.lap("aggregate")
            messages = list(self.configure_evaluate(server_round, arrays, ConfigRecord(), grid))
            if messages:
                agg = self.aggregate_evaluate(server_round,
                                              collect(grid, push(grid, messages), timeout))
                self.last_round["federated_evaluation"] = dict(agg) if agg else None
                clock.lap("federated_evaluate")
            # seconds of this round's parts (the recorder adds its own); a round's checkpoint
            # comes after its record is written, so each record carries the previous round's
            self.last_round["timing"] = {**clock.laps, "checkpoint_previous_round": after_previous,
                                         "loss_check": self.loss_check_seconds}
            self.loss_check_seconds = 0.0
            done = self.last_round
            if server_round < last and overlap:
                pending = self.push_train(grid, server_round + 1, arrays)
                clock.lap("configure_next")
            upcoming, self.last_round = self.last_round, done     # the recorder reads round t
            evaluate_fn(server_round, arrays)
            clock.lap("evaluate_and_record")
            after_round(server_round, arrays)
            after_previous = clock.lap("checkpoint")
            self.last_round = upcoming
            if server_round < last and not overlap:
                pending = self.push_train(grid, server_round + 1, arrays)
                clock.lap("configure_next")
            clock.laps = {"configure": clock.laps.get("configure_next", 0.0)}
        return arrays

    def push_train(self, grid: Grid, server_round: int, arrays: ArrayRecord) -> Any:
        return push(grid, self.driver.configure_train(server_round, arrays, ConfigRecord(), grid))

    def state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """Arrays and JSON state a checkpoint needs (subclasses add their caches)."""
        return {"momentum": dict(self.momentum_buffer)}, {}

    def load_state(self, arrays: dict[str, dict[str, np.ndarray]], state: dict[str, Any]) -> None:
        self.momentum_buffer = dict(arrays.get("momentum", {}))

    # -- replies ---------------------------------------------------------------------------
    def parse_reply(self, msg: Message) -> dict[str, Any]:
        """Arrays and metrics of one train reply, checked; raises ReplyError if unusable."""
        content = msg.content
        if "arrays" not in content.array_records or "metrics" not in content.metric_records:
            raise ReplyError("reply lacks the 'arrays' ArrayRecord or the 'metrics' MetricRecord")
        arrays = arrays_to_numpy(content.array_records["arrays"])
        assert self.global_arrays is not None
        extra = sorted(set(arrays) - set(self.global_arrays))
        if extra:
            raise ReplyError(f"unexpected arrays {extra[:3]}")
        for key, ref in self.global_arrays.items():
            got = arrays.get(key)
            if got is None or got.shape != ref.shape or got.dtype != ref.dtype:
                found = "missing" if got is None else f"{got.dtype}{list(got.shape)}"
                raise ReplyError(f"array '{key}' is {found}, expected {ref.dtype}{list(ref.shape)}")
            if np.issubdtype(got.dtype, np.floating) and not np.isfinite(got).all():
                raise ReplyError(f"array '{key}' has non-finite values")
        metrics = dict(content.metric_records["metrics"])
        for key in ("partition_id", "num_labeled", "num_unlabeled"):
            if not isinstance(metrics.get(key), int) or metrics[key] < 0:
                raise ReplyError(f"metric '{key}' missing or not a non-negative integer")
        held = self.pids_on.get(msg.metadata.src_node_id)
        if held is not None and metrics["partition_id"] not in held:
            raise ReplyError(f"claims partition {metrics['partition_id']} but the node was sent "
                             f"{held if len(held) > 1 else held[0]}")
        app_u = np.asarray(metrics.get("app_u", []), dtype=np.float64).reshape(-1)
        k = self.num_classes
        if app_u.shape != (k,):
            raise ReplyError(f"app_u has length {app_u.size}, expected {k}")
        if not np.isfinite(app_u).all() or (app_u < 0).any() or abs(app_u.sum() - 1) > 1e-3:
            raise ReplyError("app_u must be finite, non-negative and sum to 1")
        return {"arrays": arrays, "metrics": metrics, "app_u": app_u}

    def aggregation_weights(self, parsed: list[dict[str, Any]],
                            server_round: int | None = None) -> tuple[np.ndarray, dict]:
        """beta on the simplex: DMA on the clients' APP-U, or uniform / sample-sized. In a
        warm-up round every client trained on its labels alone, so every method weighs the
        updates as labels-only FedAvg does (no DMA, n_m = labels): the warm-up is the same run
        for every method of a seed, and a paired comparison starts from one model."""
        n = len(parsed)
        d = self.cfg["dma"]
        warmup = server_round is not None and server_round <= self.cfg["train"]["warmup_rounds"]
        if d["enabled"] and not warmup:
            res = dma_weights(np.stack([p["app_u"] for p in parsed]), d["mode"], d["steps"],
                              d["lr"], d["optimizer"], d["cap"])
            if res.at_cap:
                log(INFO, "round %s: DMA cap binds: %s of %s clients held at dma.cap/m = %.3f",
                    self.last_round.get("round"), res.at_cap, n, d["cap"] / n)
            return res.weights, {"mode": d["mode"], "loss_uniform": res.loss_uniform,
                                 "loss_weights": res.loss, "weight_entropy": res.entropy,
                                 "weights": res.weights.tolist(), "cap": d["cap"],
                                 "at_cap": res.at_cap}
        if self.cfg["server"]["weighting"] == "samples":
            # n_m: the examples client m trains on (its labels alone for labels-only training)
            unl = TRAINERS[self.cfg["method"]["trainer"]].uses_unlabeled and not warmup
            sizes = np.array([n_l + unl * n_u for n_l, n_u in
                              (self.trusted_sizes(p["metrics"]) for p in parsed)],
                             dtype=np.float64)
            return sizes / max(sizes.sum(), 1.0), {}
        return np.full(n, 1.0 / n), {}

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        sampled = self.last_round.get("sampled", [])
        parsed, failures, bad = [], [], []
        for msg in replies:
            try:
                if msg.has_error():
                    raise ReplyError(f"client error: {msg.error.reason}")
                reply = self.parse_reply(msg)
                if sampled and reply["metrics"]["partition_id"] not in sampled:
                    raise ReplyError(f"partition {reply['metrics']['partition_id']} was not "
                                     "sampled this round")
                if any(p["metrics"]["partition_id"] == reply["metrics"]["partition_id"]
                       for p in parsed):
                    raise ReplyError(f"a second reply for partition "
                                     f"{reply['metrics']['partition_id']} this round")
                parsed.append(reply)
            except ReplyError as err:
                bad.append((msg.metadata.src_node_id, str(err)))
        answered = {p["metrics"]["partition_id"] for p in parsed}
        for node, reason in bad:          # charged to a sampled partition of that node
            pid = next((q for q in self.pids_on.get(node, []) if q not in answered
                        and (not sampled or q in sampled)), None)
            answered.add(pid)
            failures.append({"partition_id": pid, "node_id": node, "reason": reason})
        for pid in sampled:
            if pid not in answered:
                failures.append({"partition_id": pid, "node_id": self.node_of.get(pid),
                                 "reason": "no reply within fl.round_timeout (node failed or gone)"})
        for f in failures:
            log(WARNING, "round %s: reply of partition %s (node %s) dropped: %s", server_round,
                f["partition_id"], f["node_id"], f["reason"])
        parsed.sort(key=lambda p: p["metrics"]["partition_id"])
        self.last_round.update({"failures": failures, "skipped": False})
        if len(parsed) < self.cfg["fl"]["min_train_clients"]:
            log(WARNING, "round %s: %s valid replies < fl.min_train_clients=%s; global model kept",
                server_round, len(parsed), self.cfg["fl"]["min_train_clients"])
            self.last_round.update({"skipped": True, "clients": [], "dma": None,
                                    "gradient_diversity": None})
            return None, MetricRecord({"valid_replies": len(parsed)})
        weights, diagnostics = self.aggregation_weights(parsed, server_round)
        client_arrays = [p["arrays"] for p in parsed]
        # a diagnostic: computed (on one thread) when the round is recorded, after the next
        # round's instructions have gone out, instead of on the round's critical path
        old = self.global_arrays
        self.last_round["gradient_diversity"] = lambda: gradient_diversity(old, client_arrays)
        coefficients = self.coefficients(server_round, parsed, weights)
        new = self.server_update(client_arrays, coefficients)
        self.last_round["clients"] = [
            client_record(p["metrics"], float(w)) for p, w in zip(parsed, coefficients)]
        self.last_round["dma"] = diagnostics or None
        self.after_aggregate(server_round, parsed)
        return numpy_to_arrays(new), MetricRecord({"valid_replies": len(parsed)})

    def coefficients(self, server_round: int, parsed: list[dict[str, Any]],
                     weights: np.ndarray) -> np.ndarray:
        """Each client's coefficient in the aggregate; what they leave stays on the global model."""
        return weights

    def after_aggregate(self, server_round: int, parsed: list[dict[str, Any]]) -> None:
        """Hook for server-side caches built from this round's valid replies."""

    def defend(self, client_arrays: list[dict[str, np.ndarray]],
               weights: np.ndarray) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
        """The norm bound and Krum selection of `server.robust` (strategy/robust.py); what they
        did goes to metrics.jsonl as `robust`."""
        assert self.global_arrays is not None
        rb = self.cfg["server"]["robust"]
        diag: dict[str, Any] = {"rule": rb["rule"], "clip": rb["clip"]}
        if rb["clip"] is not None and len(client_arrays) > 1:
            client_arrays, info = robust.clip_updates(self.global_arrays, client_arrays,
                                                      rb["clip"], self.workers)
            diag.update(info)
            if info["clipped"]:
                log(INFO, "round %s: updates of %s client(s) clipped to %.3g (%s x the median "
                    "norm)", self.last_round.get("round"), len(info["clipped"]),
                    info["norm_bound"], rb["clip"])
        keep = list(range(len(client_arrays)))
        cos = None
        if rb["min_cosine"] is not None and len(client_arrays) > 2:
            cos = robust.median_agreement(self.global_arrays, client_arrays, self.workers)
            keep = robust.agreeing(cos, rb["min_cosine"], rb["min_cosine_margin"])
            diag.update(cosines=cos.tolist(), dropped=[i for i in range(len(cos))
                                                       if i not in keep])
            if diag["dropped"]:
                log(INFO, "round %s: agreement filter dropped update(s) %s: cosine with the "
                    "median of the others below %s and the round's median cosine minus %s",
                    self.last_round.get("round"), diag["dropped"], rb["min_cosine"],
                    rb["min_cosine_margin"])
        if rb["loss_check"] is not None and self.audit is not None and len(keep) > 2:
            tested = None                  # the least agreeing of those kept, or all
            if rb.get("loss_check_candidates") is not None:
                if cos is None:
                    cos = robust.median_agreement(self.global_arrays, client_arrays, self.workers)
                    diag["cosines"] = cos.tolist()
                order = np.argsort(cos[keep], kind="stable")
                tested = order[:rb["loss_check_candidates"]].tolist()
            tol = self.loss_tolerance(self.last_round.get("round"))
            t0 = time.perf_counter()
            sub, info = robust.loss_check(self.global_arrays, [client_arrays[i] for i in keep],
                                          np.asarray(weights, dtype=np.float64)[keep],
                                          self.audit, tol, tested, self.audit_workers)
            self.loss_check_seconds = time.perf_counter() - t0      # part of "aggregate"
            info["loss_dropped"] = [keep[i] for i in info["loss_dropped"]]
            diag.update(info, loss_tolerance=tol)
            if info["loss_dropped"]:
                log(INFO, "round %s: loss check dropped client(s) %s: without each the average's "
                    "validation loss is lower by more than %.3g of it",
                    self.last_round.get("round"), info["loss_dropped"], tol)
            keep = [keep[i] for i in sub]
        if rb["rule"] in ("krum", "multikrum"):
            f = rb["num_malicious"]
            k = 1 if rb["rule"] == "krum" else (rb["num_selected"] or len(keep) - f)
            keep = [keep[i] for i in robust.krum_select([client_arrays[i] for i in keep], f, k)]
        if len(keep) < len(client_arrays):
            weights = robust.renormalise(np.asarray(weights, dtype=np.float64)[keep],
                                         float(np.sum(weights)))
            client_arrays = [client_arrays[i] for i in keep]
            diag["selected"] = keep
        self.last_round["robust"] = diag
        return client_arrays, weights

    def server_update(self, client_arrays: list[dict[str, np.ndarray]],
                      weights: np.ndarray) -> dict[str, np.ndarray]:
        assert self.global_arrays is not None
        s, mu = self.cfg["server"]["lr"], self.cfg["server"]["momentum"]
        client_arrays, weights = self.defend(client_arrays, weights)
        rule, trim = self.cfg["server"]["robust"]["rule"], self.cfg["server"]["robust"]["trim"]
        new: dict[str, np.ndarray] = {}
        for key, old in self.global_arrays.items():
            if not np.issubdtype(old.dtype, np.floating):      # e.g. num_batches_tracked
                new[key] = np.max([a[key] for a in client_arrays], axis=0).astype(old.dtype)
                continue
            if rule in ("median", "trimmed_mean"):              # no weights: DMA cannot apply
                avg = robust.combine(np.stack([a[key].astype(np.float64) for a in client_arrays]),
                                     weights, rule, trim)
            else:
                avg = robust.weighted_mean(old, [a[key] for a in client_arrays], weights)
            if key.endswith(STAT_SUFFIXES):
                new[key] = avg.astype(old.dtype)
                continue
            step = old.astype(np.float64) - avg
            buf = mu * self.momentum_buffer[key] + step if key in self.momentum_buffer else step
            self.momentum_buffer[key] = buf
            new[key] = (old.astype(np.float64) - s * buf).astype(old.dtype)
        return new


def push(grid: Grid, messages: Iterable[Message]) -> Any:
    """Send instructions without waiting: their message ids, or for an in-process grid that
    answers at once (`LocalGrid`) the replies themselves."""
    messages = list(messages)
    if getattr(grid, "synchronous", False):
        return list(grid.send_and_receive(messages))
    return set(grid.push_messages(messages))


def collect(grid: Grid, pending: Any, timeout: float) -> list[Message]:
    """The replies to `push`'s instructions, polled every few milliseconds (Flower's own
    send_and_receive sleeps 0.1 s between polls in simulation and 3 s in deployment)."""
    if not isinstance(pending, set):
        return pending
    ids, replies = set(pending), []
    deadline, pause = time.monotonic() + timeout, 0.002
    while ids and time.monotonic() < deadline:
        got = list(grid.pull_messages(ids))
        replies += got
        ids -= {m.metadata.reply_to_message_id for m in got}
        if ids:
            time.sleep(pause)
            pause = min(pause * 1.5, 0.05)       # short waits early, at most 20 polls a second
    return replies


class Stopwatch:
    """Named laps of a round, in seconds."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self.t = time.perf_counter()

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self.t
        self.t = now
        return self.laps[name]


def gradient_diversity(global_arrays: dict[str, np.ndarray],
                       client_arrays: list[dict[str, np.ndarray]], workers: int = 1) -> float | None:
    """sum_k |D_k|^2 / |sum_k D_k|^2 over the trainable arrays (FedRGD's Eq. 1); None if all
    updates cancel or nobody moved. The updates in float32, the sums in float64."""
    keys = [k for k, v in global_arrays.items()
            if np.issubdtype(v.dtype, np.floating) and not k.endswith(STAT_SUFFIXES)]
    flat = robust.flat_updates(global_arrays, client_arrays, keys)

    def sums(block: np.ndarray) -> np.ndarray:       # Σ_k |D_k|², |Σ_k D_k|² over the block
        # (einsum, not np.dot: numpy's BLAS call per block was 4x slower in a simulation run)
        b = block.astype(np.float64)
        total = b.sum(axis=0)
        return np.array([np.einsum("ij,ij->", b, b), np.einsum("i,i->", total, total)])

    sum_sq, denom = robust.block_sums(sums, flat, workers)
    return float(sum_sq) / float(denom) if denom > 0 else None


def _num(metrics: dict[str, Any], key: str) -> float | None:
    """An optional scalar metric, or None when absent or not a finite number."""
    v = metrics.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _floats(metrics: dict[str, Any], key: str) -> list[float]:
    v = metrics.get(key)
    return [float(x) for x in v] if isinstance(v, list) else []


def client_record(metrics: dict[str, Any], weight: float) -> dict[str, Any]:
    """One participating client's entry in metrics.jsonl (optional metrics may be missing)."""
    count = _num(metrics, "pseudo_label_count") or 0
    return {
        "partition_id": metrics["partition_id"],
        "num_labeled": metrics["num_labeled"],
        "num_unlabeled": metrics["num_unlabeled"],
        "app_u": _floats(metrics, "app_u"),
        "app_u_global": _floats(metrics, "app_u_global"),
        "weight": weight,
        "pseudo_label_accuracy": _num(metrics, "pseudo_label_accuracy") if count > 0 else None,
        "pseudo_label_ratio": _num(metrics, "pseudo_label_ratio") or 0.0,
        "pseudo_label_accuracy_all": _num(metrics, "pseudo_label_accuracy_all"),
        "labeled_histogram": [int(x) for x in _floats(metrics, "labeled_histogram")],
        "pseudo_label_histogram": [int(x) for x in _floats(metrics, "pseudo_label_histogram")],
        "loss_sup": _num(metrics, "loss_sup"),
        "loss_unsup": _num(metrics, "loss_unsup"),
        "train_seconds": _num(metrics, "train_seconds"),
        "setup_seconds": _num(metrics, "setup_seconds"),
        "reply_seconds": _num(metrics, "reply_seconds"),
    }

"""ServerApp: resolves the configuration, writes the run directory, binds nodes to partitions,
runs the strategy with central evaluation every round, and prints a summary."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from fssl import checkpoint
from fssl.config import DEFENCES, apply_defence_scope, warmup_note
from fssl.methods import make_model
from fssl.partition import partition_label, save_partition, scenario_of
from fssl.profiling import Timeline, profiled
from fssl.provenance import provenance
from fssl.runtime import cpu_threads, data_meta, dataset_for, keep_freed_memory, partition_for
from fssl.server_train import ServerLabels
from fssl.train import resolve_device
from strategy import ServerSetup, WeightedAverage, make_strategy
from strategy.contract import ReplyError, arrays_to_numpy, numpy_to_arrays, parse_node_info
from strategy.flower import StrategyFailed

from .config import resolve
from .recorder import RoundRecorder
from .rounds import FAILURE, RoundLoop, RunFailed, collect, failed_before, push

app = ServerApp()


class NodeError(RuntimeError):
    """The federation does not match the configuration."""


def run_dir_for(cfg: dict[str, Any]) -> Path:
    out = cfg["output_dir"] or (
        f"runs/{datetime.now():%Y%m%d-%H%M%S}_{cfg['method']['name']}_{cfg['dataset']['name']}_"
        f"{partition_label(cfg['partition'])}_s{cfg['seed']}"
    )
    path = Path(out).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def query_nodes(
    grid: Grid,
    nodes: list[int],
    timeout: float,
    timeline: Timeline | None = None,
    at_least: float = 30.0,
    required: bool = True,
) -> dict[int, dict[str, int]]:
    """Ask each node its partition id and whether it holds its own data file (and, for the
    start-up timeline, when its process started and imported the ClientApp). A node that does
    not answer well (the SuperLink reports it unavailable while it reconnects after a SuperLink
    restart, or its reply is missing or malformed: replies are untrusted) is asked again until
    the time is up; then, or at once where its ClientApp failed, the node's reason ends the run,
    unless not `required`: then the time-out leaves that node out, with one line."""
    deadline = time.monotonic() + max(timeout, at_least)
    info: dict[int, dict[str, int]] = {}
    started: list[float | None] = []
    imported: list[float] = []
    pending = list(nodes)
    while pending:
        failed: dict[int, str] = {}
        for node, reply in ask_nodes(grid, pending, max(1.0, deadline - time.monotonic())):
            try:
                if reply is None:
                    raise ReplyError("no reply before the time was up")
                if reply.has_error() and "unavailable" not in reply.error.reason.lower():
                    # Its ClientApp failed: asking again would fail again.
                    raise NodeError(
                        f"node {node} failed to report its partition: {reply.error.reason}"
                    )
                if reply.has_error():
                    raise ReplyError(reply.error.reason)
                rec = parse_node_info(reply)
            except ReplyError as err:
                failed[node] = str(err)
                continue
            info[node] = {"pid": rec["pid"], "own-data": rec["own-data"]}
            if timeline is not None and rec["imported-at"]:
                started.append(rec["process-start"] or None)
                imported.append(rec["imported-at"])
        if failed and time.monotonic() + 2.0 > deadline:
            node, reason = next(iter(failed.items()))
            if required:
                raise NodeError(f"node {node} failed to report its partition: {reason}")
            for node, reason in failed.items():
                print(f"[feddb] node {node} left out: no partition reported ({reason})", flush=True)
            break
        pending = list(failed)
        if pending:
            time.sleep(2.0)
    if timeline is not None and imported:
        timeline.marks["client_process_start"] = min((t for t in started if t), default=None)
        timeline.marks["client_app_imported"] = max(imported)
    return info


def ask_nodes(grid: Grid, nodes: list[int], timeout: float) -> list[tuple[int, Message | None]]:
    """Each node with its reply to a start-up query (None: none came). Replies are matched by
    the message they answer, not by their source: a reply whose objects could not be pulled
    comes back from Flower as an error with the server's own node id as its source."""
    msgs = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]
    replies = list(grid.send_and_receive(msgs, timeout=timeout))
    by_query = {r.metadata.reply_to_message_id: r for r in replies}
    return [(m.metadata.dst_node_id, by_query.get(m.metadata.message_id)) for m in msgs]


def bind_partitions(
    grid: Grid,
    num_clients: int,
    timeout: float = 60.0,
    timeline: Timeline | None = None,
    min_nodes: int | None = None,
    at_least: float = 30.0,
) -> dict[int, int]:
    """pid -> node id. One node per client when the federation has exactly that many (each
    trains its node_config partition). Nodes without their own data file (simulation) may hold
    several: with fewer SuperNodes than clients (Flower's default simulation has 2), client m goes
    to node m mod N and each instruction names its partition. Nodes with their own data files
    (deployment) must be one per client; the server waits up to `timeout` s for them, and
    starts with those that answered, at least `min_nodes` (default: all); a partition whose
    node did not answer is bound before a later round (`RejoinedNodes`)."""
    needed = "all needed" if min_nodes is None else f"fl.min_train_clients={min_nodes}"
    min_nodes = num_clients if min_nodes is None else min_nodes
    deadline = time.monotonic() + timeout
    nodes = sorted(grid.get_node_ids())
    while not nodes and time.monotonic() < deadline:
        time.sleep(0.5)
        nodes = sorted(grid.get_node_ids())
    # a node may die while it is asked (churn): it is left out here and bound when it answers
    info = query_nodes(grid, nodes, timeout, timeline, at_least, required=False) if nodes else {}
    asked = set(nodes)
    shared = bool(info) and not any(v["own-data"] for v in info.values())
    if shared and len(info) != len(nodes):  # a simulation's nodes do not die
        raise NodeError(f"only {len(info)} of {len(nodes)} nodes reported their partition")
    if shared and len(nodes) != num_clients:
        return {pid: nodes[pid % len(nodes)] for pid in range(num_clients)}
    while len(nodes) < num_clients and time.monotonic() < deadline:
        time.sleep(1.0)
        nodes = sorted(grid.get_node_ids())
    if len(nodes) != num_clients:
        raise NodeError(
            f"the federation has {len(nodes)} SuperNodes holding their own data files "
            f"(node_config data-path) but fl.num_clients={num_clients}: start one SuperNode per "
            "client, or set fl.num_clients to the number of nodes."
        )
    late = [n for n in nodes if n not in asked]  # connected since the first question
    info.update(query_nodes(grid, late, timeout, at_least=at_least, required=False) if late else {})
    node_of: dict[int, int] = {}
    for node, v in sorted(info.items()):
        pid = v["pid"]
        if pid in node_of or not 0 <= pid < num_clients:
            raise NodeError(f"partition-id {pid} is duplicated or outside 0..{num_clients - 1}")
        node_of[pid] = node
    if len(node_of) < max(1, min_nodes):
        raise NodeError(
            f"only {len(node_of)} of {num_clients} nodes reported their partition ({needed})"
        )
    if len(node_of) < num_clients:
        missing = sorted(set(range(num_clients)) - set(node_of))
        print(
            f"[feddb] partitions {missing} have no node yet: they train once a node holding "
            "them answers (asked before each round)",
            flush=True,
        )
    return node_of


class RejoinedNodes:
    """Before each round of a deployment: SuperNodes that connected since the last look (a node
    restarted after a crash, or one replacing it, or one left out at start-up) are asked their
    partition, which then goes to them. A question waits at most `wait` s within the round (a
    live node's ClientApp answers in a few seconds) and then stays open across rounds, its
    answer taken whenever it arrives: a node that died meanwhile costs no round more than `wait`,
    and no node is asked again while its question is open (for up to `expire` s) or within
    `retry` s of a refusal (it named no partition of this run)."""

    def __init__(
        self,
        grid: Grid,
        strategy: WeightedAverage,
        num_clients: int,
        wait: float = 10.0,
        retry: float = 60.0,
        expire: float = 300.0,
    ) -> None:
        self.grid, self.strategy, self.num_clients = grid, strategy, num_clients
        self.wait, self.retry, self.expire = wait, retry, expire
        self.open: dict[str, tuple[int, float]] = {}  # question's message id -> (node, sent at)
        self.refused: dict[int, float] = {}  # node -> when it answered with no usable partition

    def __call__(self, server_round: int = 0) -> list[int]:
        """The partitions that moved to a new node (their instructions of this round go to it)."""
        now = time.monotonic()
        self.open = {m: (n, t) for m, (n, t) in self.open.items() if now - t < self.expire}
        connected = set(self.grid.get_node_ids())
        asking = {n for n, _ in self.open.values()}
        joined = [
            n
            for n in sorted(connected - set(self.strategy.node_of.values()) - asking)
            if now - self.refused.get(n, -self.retry) >= self.retry
        ]
        answers = self.ask(joined, now) if joined else []
        if getattr(self.grid, "synchronous", False):  # answered at once, or never
            info = self.read(answers)
            self.open.clear()
            return self.bind(info, connected)
        if self.open:  # with the answers that came while earlier rounds ran
            answers += collect(self.grid, set(self.open), self.wait if joined else 0.0)
        return self.bind(self.read(answers), connected)

    def ask(self, nodes: list[int], now: float) -> list[Message]:
        msgs = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]
        sent = push(self.grid, msgs)
        for m in msgs:
            self.open[m.metadata.message_id] = (m.metadata.dst_node_id, now)
        return [] if isinstance(sent, set) else list(sent)  # an in-process grid answers at once

    def read(self, answers: list[Message]) -> dict[int, dict[str, int]]:
        """node -> its partition and whether it holds its own data file, from well-formed answers
        (replies are untrusted); a lost one (the node died or reconnects) is asked again."""
        info = {}
        for reply in answers:
            node, _ = self.open.pop(reply.metadata.reply_to_message_id, (None, 0.0))
            if node is None:
                continue
            try:
                if reply.has_error():
                    raise ReplyError(reply.error.reason)
                rec = parse_node_info(reply)
            except ReplyError as err:
                if "unavailable" not in str(err).lower():
                    self.refused[node] = time.monotonic()
                print(f"[feddb] joining node {node} not bound: {err}", flush=True)
                continue
            info[node] = {"pid": rec["pid"], "own-data": rec["own-data"]}
        return info

    def bind(self, info: dict[int, dict[str, int]], connected: set[int]) -> list[int]:
        node_of, moved = dict(self.strategy.node_of), []
        claims: dict[int, list[int]] = {}
        for node, v in sorted(info.items()):
            if v["own-data"] and 0 <= v["pid"] < self.num_clients:
                claims.setdefault(v["pid"], []).append(node)
            else:
                self.refused[node] = time.monotonic()
        for pid, nodes in sorted(claims.items()):
            # a partition moves only from a node that has gone, and only to one claimant: a second
            # node naming a live node's partition (a misconfigured or dishonest one) takes nothing
            if node_of.get(pid) in connected or len(nodes) > 1:
                print(f"[feddb] partition {pid} not rebound to nodes {nodes}", flush=True)
                for node in nodes:
                    self.refused[node] = time.monotonic()
                continue
            node_of[pid] = nodes[0]
            moved.append(pid)
        if moved:
            print(f"[feddb] partitions {moved} rejoined on new nodes", flush=True)
            self.strategy.bind_nodes(node_of)
        return moved


def server_threads(setting: Any, grid: Grid, device: torch.device) -> int | None:
    """The ServerApp's CPU threads (`eval.threads`); None: leave torch's default. `auto`: the
    project's rule (fssl.runtime.cpu_threads); a deployed ServerApp has its machine to itself,
    and in a simulation the clients occupy the cores while the server evaluates the previous
    round (measured on 2 cores, one server thread made the whole round 23 % faster)."""
    if setting != "auto":
        return int(setting)
    if device.type != "cpu":
        return None
    return cpu_threads(alone=not simulated(grid))


def in_memory(grid: Grid) -> bool:
    """Whether `grid` is Flower's simulation grid. Its module is not imported here: it pulls in
    the SuperLink's state (SQLAlchemy, Alembic, FastAPI: 2.7 s of a deployed ServerApp's start on
    2 cores), and a process that never loaded it cannot hold one."""
    module = sys.modules.get("flwr.superlink.grid.inmemory_grid")
    return module is not None and isinstance(grid, module.InMemoryGrid)


def simulated(grid: Grid) -> bool:
    """Whether the nodes are this app's own ClientApps run by the user (Flower's simulation, or
    a grid that says so: the in-process runner's) rather than SuperNodes that may be other
    people's machines."""
    return in_memory(grid) or getattr(grid, "simulated", False) is True


def scope_defences(cfg: dict[str, Any], simulation: bool) -> None:
    """Apply `server.robust.scope` to this run's nodes and say in one line what it left off."""
    off = apply_defence_scope(cfg, untrusted_nodes=not simulation)
    if off:
        names = ", ".join(f"{name} ({path})" for path, name in DEFENCES if path in off)
        print(
            f"[feddb] a simulation runs the methods as published: {names} off "
            "(server.robust.scope=deployment puts them on SuperNodes; "
            "server.robust.scope=always turns them on here)",
            flush=True,
        )


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@app.main()
@profiled("server")
def main(grid: Grid, context: Context) -> None:
    timeline = Timeline()
    keep_freed_memory()
    cfg, resume_dir = resolve(dict(context.run_config))
    simulation = simulated(grid)
    scope_defences(cfg, simulation)
    run_dir = resume_dir or run_dir_for(cfg)
    if resume_dir is None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        (run_dir / "run_config.json").write_text(json.dumps(dict(context.run_config), indent=2))
        (run_dir / "provenance.json").write_text(json.dumps(provenance(cfg["device"]), indent=2))
    print(
        f"[feddb] method={cfg['method']['name']} dpl={cfg['dpl']} dma={cfg['dma']['enabled']} "
        f"dataset={cfg['dataset']['name']} partition={partition_label(cfg['partition'])} model={cfg['model']['name']} "
        f"rounds={cfg['num_rounds']} run_dir={run_dir}",
        flush=True,
    )

    note = warmup_note(cfg)
    if note:
        print(f"[feddb] warning: {note}", flush=True)
    device = resolve_device(cfg["device"])
    threads = server_threads(cfg["eval"].get("threads", "auto"), grid, device)
    if threads is not None:
        torch.set_num_threads(threads)
    ds = dataset_for(cfg)
    cfg["data_meta"] = data_meta(ds)
    part = partition_for(cfg)
    if resume_dir is None:
        save_partition(part, ds.y_train, run_dir, cfg)
    timeline.mark("data_ready")
    node_of = bind_partitions(
        grid,
        cfg["fl"]["num_clients"],
        cfg["fl"]["node_wait"],
        timeline,
        min_nodes=cfg["fl"]["min_train_clients"],
    )
    timeline.mark("nodes_bound")

    torch.manual_seed(cfg["seed"])
    np.random.seed(cfg["seed"])
    model = make_model(cfg, ds.num_classes, ds.image_shape[0])
    recorder = RoundRecorder(cfg, ds, model, run_dir, device)
    strategy = make_strategy(
        cfg,
        ds.num_classes,
        ServerSetup(
            node_of=node_of,
            simulated=simulation,
            max_samples=len(ds.y_train),
            partition_sizes=[
                (len(lab), len(unl)) for lab, unl in zip(part.labeled, part.unlabeled)
            ],
            workers=cores(),  # the replies are all in: no client is busy meanwhile
            **loss_check(cfg, recorder, threads == 1 and device.type == "cpu"),
        ),
    )
    if resume_dir is None:
        arrays = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
        first_round = 1
    else:
        arrays, first_round = restore(run_dir, strategy, recorder)
        print(f"[feddb] resumed from the checkpoint of round {first_round - 1}", flush=True)
        (run_dir / FAILURE).unlink(missing_ok=True)  # written again below if a round failed
    server = ServerLabels(cfg, ds, part, device) if len(part.server) else None
    if server is not None:
        print(
            f"[feddb] {scenario_of(cfg)[0]}: the server trains on its {server.size} labeled "
            f"images every round ({strategy.server_step}"
            + (", static BatchNorm" if server.static_bn else "")
            + "); the clients hold unlabeled images only",
            flush=True,
        )
    loop = RoundLoop(strategy, grid, server)
    loop.failed = failed_before(recorder.history) if resume_dir is not None else []
    if not simulation:  # SuperNodes may leave and join during the run
        loop.before_round = RejoinedNodes(grid, strategy, cfg["fl"]["num_clients"])

    def after_round(server_round: int, current: ArrayRecord) -> None:
        if not timeline.written:
            timeline.marks["first_round_sent"] = loop.first_push_time
            timeline.mark("first_round_done")
            timeline.write(run_dir / "startup.json")
        every = cfg["checkpoint"]["every"]
        if server_round == cfg["num_rounds"] or (every and server_round % every == 0):
            save_checkpoint(run_dir, server_round, current, strategy, recorder)

    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)  # one progress line per round instead of Flower's
    try:
        arrays = loop.run(
            arrays, first_round, recorder, after_round, evaluate_first=resume_dir is None
        )  # round 0, as round 1 trains
    except StrategyFailed as err:
        loop.failed.insert(0, str(err))
        fail(run_dir, loop, recorder)
    finally:
        flwr_logger.setLevel(level)
        recorder.close()
    torch.save(arrays.to_torch_state_dict(), run_dir / "final_model.pt")
    if loop.failed:
        fail(run_dir, loop, recorder)
    s = recorder.summary()
    if s["final_test_accuracy"] is not None:
        selected = (
            f", at the best-validation round {s['selected_round']}: "
            f"{s['selected_test_accuracy']:.4f}"
            if s["selected_round"]
            else ""
        )
        print(
            f"[feddb] done: final test acc {s['final_test_accuracy']:.4f}{selected}"
            + (
                f", COLLAPSED (top class {s['final_top_class_share']:.2f} of test predictions)"
                if s["collapsed"]
                else ""
            )
            + f", {s['wall_seconds']:.0f}s",
            flush=True,
        )
    print(f"[feddb] run directory: {run_dir}", flush=True)


def fail(run_dir: Path, loop: RoundLoop, recorder: RoundRecorder) -> None:
    """End a run in which a round trained no client: its summary, failure.json in the run
    directory (a sweep then runs it again), one line naming the first cause, and RunFailed
    (exit 3)."""
    if recorder.history:
        recorder.summary()
    more = f"; {len(loop.failed)} rounds like it" if len(loop.failed) > 1 else ""
    if loop.stopped_after:
        more += f", stopped after round {loop.stopped_after} (fl.max_failed_rounds in a row)"
    line = loop.failed[0] + more
    errors = run_dir / "client_errors.log"
    logs = f"; tracebacks in {errors}" if errors.is_file() else ""
    (run_dir / FAILURE).write_text(json.dumps({"reason": line, "rounds": loop.failed}, indent=2))
    print(f"[feddb] run failed: {line}{logs}", flush=True)
    raise RunFailed(line + logs)


def loss_check(cfg: dict[str, Any], recorder: RoundRecorder, idle_cores: bool) -> dict[str, Any]:
    """The loss check's evaluation for the strategy (server.robust.loss_check): the validation
    loss of a candidate model, on all cores when the clients wait idle meanwhile (a simulation
    on a CPU)."""
    if cfg["server"]["robust"]["loss_check"] is None:
        return {}
    if not recorder.has_val:
        print(
            "[feddb] WARNING: server.robust.loss_check is off in this run: the dataset has no "
            "validation split to check updates on (set dataset.val_size > 0, or "
            "server.robust.loss_check=null)",
            flush=True,
        )
        return {}
    return {"audit": recorder.audit_loss, "audit_workers": cores() if idle_cores else 1}


def save_checkpoint(
    run_dir: Path,
    server_round: int,
    arrays: ArrayRecord,
    strategy: WeightedAverage,
    recorder: RoundRecorder,
) -> None:
    """Global model, strategy state (momentum buffer, caches), RNG states, recorder state."""
    strategy_arrays, strategy_state = strategy.state()
    np_state = np.random.get_state()
    checkpoint.save(
        run_dir,
        {
            "global": arrays_to_numpy(arrays),
            "rng": {"torch": torch.get_rng_state().numpy()},
            **{f"strategy.{k}": v for k, v in strategy_arrays.items()},
        },
        {
            "round": server_round,
            "strategy": strategy_state,
            "recorder": recorder.state(),
            "numpy_rng": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        },
    )


def restore(
    run_dir: Path, strategy: WeightedAverage, recorder: RoundRecorder
) -> tuple[ArrayRecord, int]:
    file, note = checkpoint.find(run_dir)
    if note:  # the latest is corrupt: kept aside (not overwritten by the next save), and said
        print(f"[feddb] {note}", flush=True)
        for path in (run_dir / checkpoint.FILE, run_dir / f"{checkpoint.FILE}.sha256"):
            if path.is_file():
                path.replace(path.with_name(path.name.replace("checkpoint", "checkpoint.corrupt")))
    groups, state = checkpoint.load(run_dir, file)
    strategy.load_state(
        {k.split(".", 1)[1]: v for k, v in groups.items() if k.startswith("strategy.")},
        state["strategy"],
    )
    recorder.restore(state["round"], state["recorder"])
    torch.set_rng_state(torch.from_numpy(groups["rng"]["torch"]))
    kind, keys, *rest = state["numpy_rng"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    return numpy_to_arrays(groups["global"]), state["round"] + 1

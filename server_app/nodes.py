"""Which node holds which partition: the start-up query that binds each SuperNode (or
simulated ClientApp) to its partition, the nodes that rejoin a deployment between rounds, and
whether the grid's nodes are this app's own (a simulation) or SuperNodes."""

from __future__ import annotations

import sys
import time

from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fssl.profiling import Timeline
from strategy import MethodStrategy
from strategy.contract import ReplyError, parse_node_info

from .rounds import collect, push


class NodeError(RuntimeError):
    """The federation does not match the configuration."""


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
        strategy: MethodStrategy,
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
            for n in sorted(connected - set(self.strategy.intake.node_of.values()) - asking)
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
        node_of, moved = dict(self.strategy.intake.node_of), []
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
            self.strategy.intake.bind_nodes(node_of)
        return moved


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

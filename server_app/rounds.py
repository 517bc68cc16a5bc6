"""The round loop: send a round's instructions, collect the replies, let the strategy aggregate,
optionally evaluate on the clients, then hand the round's record to the recorder.

Where the server holds labels (labels_at_server) it trains on them every round, after the
aggregation or while the clients train, as the strategy says (fssl/server_train.py).

Round t + 1's instructions go out before round t's global model is evaluated and checkpointed,
so the server's own work overlaps the clients' (the results are the same: nothing in round t + 1
depends on the evaluation); so does the evaluation of the model the run starts from. An
in-process grid that answers at once (`synchronous`) has nothing to overlap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from fssl.record import RoundMetrics
from fssl.server_train import ServerLabels
from strategy import MethodStrategy, RoundRecord
from strategy.contract import arrays_to_numpy

EvaluateFn = Callable[[int, ArrayRecord, RoundRecord | None], Any]
FAILED_EXIT = 3  # a run that failed while training: a round trained no client (docs/running.md)
FAILURE = "failure.json"  # in the run directory of such a run: the cause, round by round
# a run that completed with rounds skipped (fewer valid replies than fl.min_train_clients, the
# global model kept): not the run its configuration asked for, so not exit 0 (docs/running.md)
SKIPPED_EXIT = 4
RUN_SKIPPED = "[feddb] rounds skipped:"  # the ServerApp's line for it, which launchers look for


def skipped_note(summary: dict[str, Any]) -> str:
    """How many rounds a finished run skipped, and which ('' for none), from its summary."""
    skipped = summary.get("skipped_rounds") or []
    if not skipped:
        return ""
    listed = ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else "")
    return (
        f"{len(skipped)} of {summary['rounds']} rounds skipped (round {listed}: fewer valid "
        "replies than fl.min_train_clients, the global model kept)"
    )


class RunFailed(RuntimeError):
    """A run in which a round trained no client: its one line names the first cause."""


def skipped_in(run_dir: str | None) -> str:
    """skipped_note of the run in `run_dir` ('' without a directory or its summary.json)."""
    summary = Path(run_dir) / "summary.json" if run_dir else None
    if summary is None or not summary.is_file():
        return ""
    return skipped_note(json.loads(summary.read_text()))


def failed_before(history: list[RoundMetrics]) -> list[str]:
    """The rounds of a resumed run's metrics that trained no client (records carry `sampled`)."""
    out = []
    for r in history:
        failures = r.failures or []
        if r.sampled and len({f["partition_id"] for f in failures}) >= r.sampled:
            first = failures[0]
            out.append(
                f"round {r.round} trained no client (all {r.sampled} sampled failed; "
                f"partition {first['partition_id']}, node {first['node_id']}: {first['reason']})"
            )
    return out


def trained_none(record: RoundRecord) -> bool:
    """Every client sampled in the round failed (an error, a malformed reply, no reply in time)."""
    failed = {f["partition_id"] for f in record.failures}
    return bool(record.sampled) and set(record.sampled) <= failed


def failure_line(record: RoundRecord) -> str:
    first = record.failures[0]
    return (
        f"round {record.round} trained no client (all {len(record.sampled)} sampled failed; "
        f"partition {first['partition_id']}, node {first['node_id']}: {first['reason']})"
    )


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
    while ids:  # asked at least once, even with no time to wait
        got = list(grid.pull_messages(ids))
        replies += got
        ids -= {m.metadata.reply_to_message_id for m in got}
        if not ids or time.monotonic() >= deadline:
            break
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)  # short waits early, at most 20 polls a second
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


class RoundLoop:
    """Rounds `first_round`..num_rounds of one run (Flower's Strategy.start always begins at 1; a
    resumed run does not)."""

    def __init__(
        self, strategy: MethodStrategy, grid: Grid, server: ServerLabels | None = None
    ) -> None:
        self.strategy, self.grid = strategy, grid
        self.cfg = strategy.cfg
        self.server = server  # labels_at_server: the server's labels and its training
        self.server_model: ArrayRecord | None = None  # the server's model of the round (parallel)
        # called with the round before its instructions go out (deployment: nodes that joined)
        self.before_round: Callable[[int], None] | None = None
        self.parallel_seconds = 0.0  # its training, inside the push of the round's instructions
        self.first_push_time: float | None = None  # the start-up timeline's "first round sent"
        self.failed: list[str] = []  # one line per round that trained no client
        self.stopped_after: int | None = (
            None  # the round after which fl.max_failed_rounds stopped it
        )
        self.in_a_row = 0  # rounds in a row that trained no client

    def push_train(self, server_round: int, arrays: ArrayRecord) -> Any:
        """Send round t's instructions; a server that trains in parallel then trains on its
        labels from the same global model while the clients train."""
        if self.before_round is not None:
            self.before_round(server_round)
        driver = self.strategy.driver
        pending = push(
            self.grid, driver.configure_train(server_round, arrays, ConfigRecord(), self.grid)
        )
        if self.server is not None and self.strategy.server_step == "parallel":
            t0 = time.perf_counter()
            self.server_model = self.server_train(server_round, arrays)
            self.strategy.server_arrays = arrays_to_numpy(self.server_model)
            self.parallel_seconds = time.perf_counter() - t0
        return pending

    def server_train(self, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        assert self.server is not None
        return ArrayRecord(self.server.train(server_round, arrays.to_torch_state_dict()))

    def after_aggregate(self, server_round: int, new: ArrayRecord | None, arrays: ArrayRecord):
        """The round's global model: the aggregate (or, when no client replied, the model kept),
        then the server's own step where it holds labels (strategy.base: server_step)."""
        if self.server is None:
            return new if new is not None else arrays
        if self.strategy.server_step == "parallel":
            return new if new is not None else self.server_model
        return self.server_train(server_round, new if new is not None else arrays)

    def federated_evaluation(
        self, server_round: int, arrays: ArrayRecord, timeout: float
    ) -> dict[str, Any] | None | bool:
        """The clients' evaluation of the new global model (fl.fraction_evaluate); False when
        the run has none."""
        messages = list(
            self.strategy.configure_evaluate(server_round, arrays, ConfigRecord(), self.grid)
        )
        if not messages:
            return False
        agg = self.strategy.aggregate_evaluate(
            server_round, collect(self.grid, push(self.grid, messages), timeout)
        )
        return dict(agg) if agg else None

    def run(
        self,
        arrays: ArrayRecord,
        first_round: int,
        evaluate_fn: EvaluateFn,
        after_round: Callable[[int, ArrayRecord], None],
        evaluate_first: bool = False,
    ) -> ArrayRecord:
        """Train, aggregate, federated evaluation, then `evaluate_fn(round, arrays, record)` and
        `after_round(round, arrays)` (checkpoints); `evaluate_first`: the starting model too
        (round first_round - 1, with no record)."""
        timeout = self.cfg["fl"]["round_timeout"]
        last = self.cfg["num_rounds"]
        after_previous = 0.0
        overlap = not getattr(self.grid, "synchronous", False)
        clock = Stopwatch()
        pending = self.push_train(first_round, arrays) if first_round <= last else None
        self.first_push_time = time.time()
        if evaluate_first:
            evaluate_fn(first_round - 1, arrays, None)
        for server_round in range(first_round, last + 1):
            clock.lap("configure")
            replies = collect(self.grid, pending, timeout)
            clock.lap("communicate")  # waiting for the clients' replies
            record = self.strategy.round_record
            # a round no client joined goes to the strategy itself: Flower's wrappers (DP) would
            # average zero replies
            aggregator = self.strategy.driver if record.sampled or replies else self.strategy
            new, _ = aggregator.aggregate_train(server_round, replies)
            clock.lap("aggregate")
            arrays = self.after_aggregate(server_round, new, arrays)
            if self.server is not None:
                clock.lap("server_train")
                if self.strategy.server_step == "parallel":  # done while the clients trained
                    clock.laps["server_train"] += self.parallel_seconds
                    clock.laps["configure"] -= self.parallel_seconds
            evaluation = self.federated_evaluation(server_round, arrays, timeout)
            if evaluation is not False:
                record.federated_evaluation = evaluation
                clock.lap("federated_evaluate")
            # seconds of this round's parts (the recorder adds its own); a round's checkpoint
            # comes after its record is written, so each record carries the previous round's
            record.timing = {
                **clock.laps,
                "checkpoint_previous_round": after_previous,
                "loss_check": record.loss_check_seconds,
            }
            if server_round < last and overlap:
                pending = self.push_train(server_round + 1, arrays)
                clock.lap("configure_next")
            evaluate_fn(server_round, arrays, record)
            clock.lap("evaluate_and_record")
            after_round(server_round, arrays)
            after_previous = clock.lap("checkpoint")
            if self.gave_up(server_round, record):
                self.stopped_after = server_round
                break
            if server_round < last and not overlap:
                pending = self.push_train(server_round + 1, arrays)
                clock.lap("configure_next")
            clock.laps = {"configure": clock.laps.get("configure_next", 0.0)}
        return arrays

    def gave_up(self, server_round: int, record: RoundRecord) -> bool:
        """Note a round that trained no client; True once `fl.max_failed_rounds` of them come in
        a row (0: never stop), since more rounds would fail the same way."""
        if not trained_none(record):
            self.in_a_row = 0
            return False
        self.failed.append(failure_line(record))
        self.in_a_row += 1
        limit = self.cfg["fl"].get("max_failed_rounds", 3)
        return bool(limit) and self.in_a_row >= limit and server_round < self.cfg["num_rounds"]

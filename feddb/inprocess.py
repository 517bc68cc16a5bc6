"""The real ServerApp, strategy and ClientApp in one process, without Ray or a SuperLink.

    feddb local --run-config "method='fixmatch' seed=1"

Clients run one after another over `LocalGrid`, an in-process Flower Grid; results are the same as
`flwr run` (tested against a deployed run). No 20-30 s start-up per run: the sanity ladder and the
miniature sweep use it. `hook(instruction, context, reply)` may replace a reply, drop it (return
None) or raise; exceptions inside the ClientApp become error replies, as Flower's runtime does.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Error, Message, MessageType, Metadata, RecordDict
from flwr.serverapp import Grid

PROJECT = Path(__file__).resolve().parents[1]


def set_task_identity() -> None:
    """Flower's Message() needs a task identity, which only its runtime sets."""
    from flwr.supercore.task_identity import TaskIdentity

    for key, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", "inprocess")):
        setattr(TaskIdentity, key, value)


def make_metadata(
    mtype: str = MessageType.TRAIN, src: int = 1, dst: int = 123, reply_to: str = ""
) -> Metadata:
    return Metadata(
        run_id=1,
        message_id=f"m{src}-{dst}-{time.time_ns()}",
        src_node_id=src,
        dst_node_id=dst,
        reply_to_message_id=reply_to,
        group_id="1",
        created_at=time.time(),
        ttl=3600.0,
        message_type=mtype,
    )


class LocalGrid(Grid):
    """Nodes in this process. By default `send_and_receive` runs the clients at once
    (`synchronous`: the strategy sends a round's instructions after the previous round's
    evaluation); with `overlap` instructions wait in a queue until pulled, as a SuperLink's do, so
    the strategy's overlapped loop (next round out before this one's evaluation) runs too."""

    simulated = True  # the nodes are this app's own ClientApps (server_app.nodes.simulated)

    def __init__(
        self,
        client_app,
        num_nodes: int,
        hook: Callable | None = None,
        node_config: dict[int, dict] | None = None,
        overlap: bool = False,
    ) -> None:
        """`node_config`: extra node_config entries by partition id (e.g. a test's attack)."""
        self.client_app, self.hook = client_app, hook
        self.synchronous = not overlap
        self.queued: dict[str, Message] = {}
        extra = node_config or {}
        self.contexts = {
            5000 + 17 * i: Context(
                run_id=1,
                node_id=5000 + 17 * i,
                node_config={"partition-id": i, "num-partitions": num_nodes, **extra.get(i, {})},
                state=RecordDict(),
                run_config={},
            )
            for i in range(num_nodes)
        }

    def set_run(self, run) -> None:  # noqa: D102 - not needed in-process
        pass

    @property
    def run(self):
        return None

    def create_message(self, *args, **kwargs):
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def node_states(self) -> dict[str, dict[str, np.ndarray]]:
        """What each node keeps between rounds (its context.state's arrays, a method's slots),
        by "<node id>.<slot>": in this process a checkpoint can hold it, so a run whose clients
        keep state resumes as it would have gone on."""
        return {
            f"{nid}.{slot}": {k: a.numpy() for k, a in record.items()}
            for nid, ctx in self.contexts.items()
            for slot, record in ctx.state.array_records.items()
        }

    def load_node_states(self, states: dict[str, dict[str, np.ndarray]]) -> None:
        """Give the nodes back what `node_states` took (a resumed run's)."""
        for key, arrays in states.items():
            nid, slot = key.split(".", 1)
            self.contexts[int(nid)].state[slot] = ArrayRecord(
                {k: torch.from_numpy(v) for k, v in arrays.items()}
            )

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            ins = self.instruction(msg)
            self.queued[ins.metadata.message_id] = ins
            ids.append(ins.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        replies = [self.answer(self.queued.pop(i)) for i in list(message_ids) if i in self.queued]
        return [r for r in replies if r is not None]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        replies = [self.answer(self.instruction(msg)) for msg in messages]
        return [r for r in replies if r is not None]

    def instruction(self, msg: Message) -> Message:
        ins = Message(
            content=msg.content,
            metadata=make_metadata(msg.metadata.message_type, src=0, dst=msg.metadata.dst_node_id),
        )
        # As Flower's grids do: the sent message learns its id, which its reply answers.
        msg.metadata.__dict__["_message_id"] = ins.metadata.message_id
        return ins

    def answer(self, ins: Message) -> Message | None:
        """The ClientApp's reply (an error reply if it raised), passed through the hook."""
        ctx = self.contexts[ins.metadata.dst_node_id]
        try:
            reply = self.client_app(ins, ctx)
        except Exception as err:  # noqa: BLE001 - what Flower's runtime does
            reply = Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=ins)
        return self.hook(ins, ctx, reply) if self.hook is not None else reply


def run_in_process(
    run_config: dict,
    num_nodes: int | None = None,
    hook: Callable | None = None,
    app=None,
    node_config: dict[int, dict] | None = None,
    overlap: bool = False,
    state: RecordDict | None = None,
) -> None:
    """The real ServerApp over a LocalGrid (one node per client unless `num_nodes` is given);
    `state`: the ServerApp's context state (server_app.app.STATE: run directory, rounds skipped)."""
    from client_app.app import app as client_app
    from fssl.config import run_config_defaults
    from server_app.app import app as server_app
    from server_app.config import resolve

    set_task_identity()
    rc = run_config_defaults() | run_config  # what Flower's runtime passes: all keys
    if num_nodes is None:
        num_nodes = resolve(rc)[0]["fl"]["num_clients"]
    ctx = Context(
        run_id=1,
        node_id=0,
        node_config={},
        state=RecordDict() if state is None else state,
        run_config=rc,
    )
    server_app(LocalGrid(app or client_app, num_nodes, hook, node_config, overlap), ctx)


def main(argv: list[str] | None = None) -> int:
    from feddb.launch import add_run_config, one_run_config, preflight

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_config(ap)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(PROJECT))
    from fssl.checks import ConfigError
    from fssl.config import interrupted_exit
    from fssl.data import DataError
    from fssl.profiling import interruptible
    from server_app.app import STATE
    from server_app.rounds import FAILED_EXIT, SKIPPED_EXIT, RunFailed

    try:
        run_config, _ = preflight(one_run_config(args.run_config), in_process=True)
    except (ConfigError, DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    state = RecordDict()
    try:
        with interruptible():  # Ctrl-C, SIGTERM, SIGHUP: one line, how to go on
            run_in_process(run_config, state=state)
    except RunFailed as err:
        print(f"error: run failed: {err}", file=sys.stderr)
        return FAILED_EXIT
    except KeyboardInterrupt as err:
        run_dir = str(state[STATE]["run_dir"]) if STATE in state else None
        command = ["feddb", "local", *(sys.argv[1:] if argv is None else argv)]
        return interrupted_exit(err, run_dir, command)
    note = state[STATE].get("skipped")  # the ServerApp's last line said it too
    if note:
        print(f"warning: {note}; exit {SKIPPED_EXIT}", file=sys.stderr)
    return SKIPPED_EXIT if note else 0


if __name__ == "__main__":
    sys.exit(main())

"""An in-process Flower Grid: the real ServerApp, strategy and ClientApp, without Ray.

`hook(instruction, context, reply)` may replace a reply, drop it (return None) or raise to make the
server crash; exceptions inside the ClientApp become error replies, as Flower's runtime does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

from conftest import make_metadata


class LocalGrid(Grid):
    def __init__(self, client_app, num_nodes: int, hook: Callable | None = None) -> None:
        self.client_app, self.hook = client_app, hook
        self.contexts = {
            5000 + 17 * i: Context(run_id=1, node_id=5000 + 17 * i,
                                   node_config={"partition-id": i, "num-partitions": num_nodes},
                                   state=RecordDict(), run_config={})
            for i in range(num_nodes)}

    def set_run(self, run) -> None:  # noqa: D102 - not needed in-process
        pass

    @property
    def run(self):
        return None

    def create_message(self, *args, **kwargs):
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        replies = []
        for msg in messages:
            dst = msg.metadata.dst_node_id
            ins = Message(content=msg.content,
                          metadata=make_metadata(msg.metadata.message_type, src=0, dst=dst))
            ctx = self.contexts[dst]
            try:
                reply = self.client_app(ins, ctx)
            except Exception as err:  # noqa: BLE001 - what Flower's runtime does
                reply = Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=ins)
            if self.hook is not None:
                reply = self.hook(ins, ctx, reply)
            if reply is not None:
                replies.append(reply)
        return replies


RUN_CONFIG_KEYS = ("method", "dpl", "dma", "dataset", "data-path", "partition", "model",
                   "experiment", "num-server-rounds", "seed", "output-dir", "overrides", "resume")


def run_in_process(run_config: dict, num_nodes: int, hook: Callable | None = None,
                   app=None) -> None:
    """The real ServerApp over a LocalGrid of `num_nodes` nodes (needs TaskIdentity patched)."""
    from client_app.app import app as client_app
    from server_app.app import app as server_app

    rc = {k: "" for k in RUN_CONFIG_KEYS} | run_config
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    server_app(LocalGrid(app or client_app, num_nodes, hook), ctx)


def metrics_without_timing(run_dir) -> list[dict]:
    import json

    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("round_seconds")
        for c in r["clients"]:
            c.pop("train_seconds")
        out.append(r)
    return out

"""ClientApp: local semi-supervised training per method (client_app/work.py), APP-U shipped in the
train reply.

Flower starts a fresh process for every message a deployed SuperNode receives, so this module
imports only Flower and the reply contract: no torch. A node with its own data (`node_config
["data-path"]`, a deployment) hands each message to its resident worker (client_app/resident.py),
which keeps torch, the model and the node's data loaded between rounds; `--node-config
"resident=false"` does the work in the message's own process instead. In a simulation the
worker process is already resident (Ray's, or the in-process engine's) and does the work itself.
"""

from __future__ import annotations

import time

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app import resident
from fssl.profiling import process_start
from strategy import contract

app = ClientApp()
IMPORTED_AT = time.time()  # for the start-up timeline (the query reply carries it)


def handle(kind: str, msg: Message, context: Context) -> Message:
    if resident.enabled(context):
        return resident.forward(kind, msg, context)
    from client_app import work

    return work.HANDLERS[kind](msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    t0 = time.time()
    reply = handle("train", msg, context)
    if context.node_config.get("data-path"):  # a deployment: a process for every message
        with_process_times(reply, t0)
    return reply


def with_process_times(reply: Message, t0: float) -> None:
    """The message's own costs beside the work's (its set-up, training and reply), into the
    reply's metrics: `process_seconds`, from this process's start to the ClientApp imported (what
    Flower's fresh process for every message costs here), and `relay_seconds`, the handling
    beyond the work's own: the hand-over to the resident worker and back (with
    `resident=false`, importing the work's modules)."""
    if reply.has_error() or "metrics" not in reply.content.metric_records:
        return
    metrics = reply.content.metric_records["metrics"]
    started = process_start()
    own = sum(
        float(metrics.get(key, 0.0)) for key in ("setup_seconds", "train_seconds", "reply_seconds")
    )
    metrics["process_seconds"] = max(0.0, IMPORTED_AT - started) if started else 0.0
    metrics["relay_seconds"] = max(0.0, time.time() - t0 - own)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Accuracy of the received model on the client's labeled data."""
    return handle("evaluate", msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds (node ids are random per run). The
    query comes before round 1: a deployed node starts its resident worker now, so that round 1
    does not wait for its imports."""
    if resident.enabled(context):
        resident.prestart(context)
    return contract.node_info_reply(
        msg,
        {
            "partition-id": int(context.node_config["partition-id"]),
            "num-partitions": int(context.node_config.get("num-partitions", -1)),
            "own-data": int(bool(context.node_config.get("data-path"))),
            "process-start": process_start() or 0.0,
            "imported-at": IMPORTED_AT,
        },
    )

"""The ClientApp's work: local semi-supervised training per method, APP-U shipped in the train
reply, and the evaluation of a received model on the client's labeled data.

The server sends the client's part of the resolved configuration (JSON, with the dataset's
classes, channels and normalisation: fssl/instruction.py) with every instruction, so clients need
no Hydra. In simulation a client takes its
partition of the dataset through `node_config["partition-id"]`; in deployment `node_config["data-path"]`
names its own file (written by `feddb deploy export`) and it never sees other clients'
data. Either way the data stays resident on the training device for the life of the process that
runs this module: a simulation's worker, or a deployed node's resident worker (client_app/resident.py).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from fssl.methods import is_path, make_trainer
from fssl.profiling import profiled
from fssl.runtime import client_data_for, keep_freed_memory, model_for, size_threads
from fssl.train import client_device, client_seed
from fssl.train import evaluate as evaluate_model
from strategy import contract
from strategy.contract import arrays_to_torch

keep_freed_memory()  # once per process: batches reuse freed memory


def _setup(msg: Message, context: Context):
    cfg = json.loads(msg.content["config"][contract.CLIENT_CONFIG])
    check_user_method(cfg["method"]["trainer"], context)
    meta = cfg["data_meta"]  # filled in by the ServerApp from its dataset
    device = client_device(cfg["device"])
    size_threads(device, alone=bool(context.node_config.get("data-path")))
    model = model_for(cfg, device)
    model.load_state_dict(arrays_to_torch(msg.content["arrays"]))
    own_file = context.node_config.get("data-path")  # deployment: this client's data only
    pid = partition_of(msg, context, bool(own_file))
    data = client_data_for(cfg, pid, device, str(own_file) if own_file else None)
    return cfg, pid, meta, data, model


def check_user_method(spec: str, context: Context) -> None:
    """A method loaded by path runs code from this machine's disk that the installed app does
    not hold: a SuperNode with its own data (a deployment) runs one only where its operator
    allowed it, `--node-config "allow-methods='<spec>'"` (several: comma-separated; '*': any)."""
    if not is_path(spec) or not context.node_config.get("data-path"):
        return
    allowed = str(context.node_config.get("allow-methods", ""))
    if allowed != "*" and spec not in [a.strip() for a in allowed.split(",")]:
        raise PermissionError(
            f"method '{spec}' is loaded by path, and this node allows none (node_config "
            "allow-methods): start it with --node-config \"allow-methods='<spec>'\" to allow it"
        )


def partition_of(msg: Message, context: Context, own_data: bool) -> int:
    """The partition to train: the one the instruction names (simulation with fewer SuperNodes
    than clients trains any partition of the shared dataset), else the node's own. A node with
    its own data file trains only that."""
    node_pid = int(context.node_config["partition-id"])
    config = msg.content.config_records.get("config")
    sent = config.get(contract.PARTITION) if config is not None else None
    if sent is None:
        return node_pid
    if own_data and int(sent) != node_pid:
        raise ValueError(
            f"this node holds only partition {node_pid}'s data (node_config "
            f"data-path) but was sent partition {sent}"
        )
    return int(sent)


@profiled("client")
def train(msg: Message, context: Context) -> Message:
    t0 = time.perf_counter()
    cfg, pid, meta, data, model = _setup(msg, context)
    setup_seconds = time.perf_counter() - t0  # config, model, received state, data
    server_round = int(msg.content["config"][contract.ROUND])
    instruction = contract.read_instruction(msg, pid, client_seed(cfg["seed"], server_round, pid))
    trainer = make_trainer(cfg, meta["mean"], meta["std"], data.x_l.device)
    metrics = trainer.fit(model, data, instruction, kept_state(context, pid))
    for name, tensors in trainer.client_state().items():  # a node may train several
        context.state[f"{name}-{pid}"] = ArrayRecord(tensors)  # partitions: one slot each
    metrics["partition_id"] = pid
    metrics["setup_seconds"] = setup_seconds
    t0 = time.perf_counter()
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if context.node_config.get("attack"):  # tests and the attack benchmark only: the attack
        from client_app.attacks import apply_attack, attack_of  # code loads for such a node alone

        state, metrics = apply_attack(
            attack_of(context.node_config), arrays_to_torch(msg.content["arrays"]), state, metrics
        )
    arrays = ArrayRecord(state)
    metrics["reply_seconds"] = time.perf_counter() - t0  # the state into the reply
    return contract.train_reply(msg, arrays, metrics)


def kept_state(context: Context, pid: int) -> dict:
    """What the method kept for partition `pid` after its last round on this node, by name (the
    slots `<name>-<pid>` of Flower's context.state, which lives as long as the node)."""
    suffix = f"-{pid}"
    return {
        key[: -len(suffix)]: record.to_torch_state_dict()
        for key, record in context.state.array_records.items()
        if key.endswith(suffix)
    }


def evaluate(msg: Message, context: Context) -> Message:
    """Accuracy of the received model on the client's labeled data."""
    cfg, pid, meta, data, model = _setup(msg, context)
    loss, acc, _, _ = evaluate_model(
        model, data.x_l, data.y_l, meta["mean"], meta["std"], cfg["eval"]["batch_size"]
    )
    metrics = MetricRecord(
        {"eval_loss": loss, "eval_accuracy": acc, "num-examples": int(len(data.y_l))}
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


def guarded(
    handler: Callable[[Message, Context], Message],
) -> Callable[[Message, Context], Message]:
    """The handler, with any exception it raises turned into an error reply that carries the
    traceback (Flower's own error reply keeps one line; the server keeps the whole of it)."""

    def run(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except Exception as err:  # noqa: BLE001 - every failure goes back to the server
            return contract.error_reply(msg, err, traceback.format_exc())

    return run


HANDLERS: dict[str, Callable[[Message, Context], Message]] = {
    "train": guarded(train),
    "evaluate": guarded(evaluate),
}

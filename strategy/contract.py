"""The messages between the ServerApp and the ClientApp: array codec, what a client sends back,
and the server's checks of it. Both apps import this one module, so the two sides cannot drift.

Replies come from SuperNodes that may be other people's machines: `parse_train_reply` accepts a
reply only if its arrays match the global model's names, shapes and dtypes and are finite, its
counts are non-negative integers, it names a partition its node was sent, and its APP-U is a
distribution over the classes. Anything else raises `ReplyError` with the reason.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fssl.instruction import Instruction

STAT_SUFFIXES = (
    "running_mean",
    "running_var",
)  # BatchNorm's running statistics: averaged, not trained

# An instruction (server -> client, fssl/instruction.py): the global arrays ("arrays"), the
# method's other named arrays (its `received`), a strategy's client terms (the ConfigRecord
# TERMS: FedProx's proximal-mu), and these keys of the ConfigRecord "config":
ROUND = "server-round"
LR = "lr"
LAMBDA_U = "lambda-u"
CLIENT_CONFIG = "client-config"  # the configuration's client part as JSON: clients need no Hydra
PARTITION = "partition-id"  # which partition to train (a node may hold several)
GLOBAL_PRIOR = "global-app-u"  # dpl_prior=global: the server's aggregated APP-U, a K-list
TERMS = "terms"

# Metrics every train reply must carry, as non-negative integers.
REQUIRED_COUNTS = ("partition_id", "num_labeled", "num_unlabeled")


class ReplyError(ValueError):
    """A client reply cannot be used; the message says why."""


# -- array codec ---------------------------------------------------------------------------------
NPY_DESCR = re.compile(rb"'descr': *'([^']+)'")


def array_to_numpy(array: Array) -> np.ndarray:
    """Flower's Array.numpy() reads each array's .npy header with ast.literal_eval (about a
    third of a paper round's server time for WRN-28-2's 160 arrays x 10 replies); the shape is
    in the Array, so only the dtype is read from the header, and the data are copied out once."""
    data = array.data
    if array.stype != "numpy.ndarray" or data[:6] != b"\x93NUMPY":
        return array.numpy()
    size = 2 if data[6] == 1 else 4  # header length field: v1 2 bytes, v2+ 4
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


# -- instructions --------------------------------------------------------------------------------
def instruction_content(arrays: ArrayRecord, ins: Instruction, client_json: str) -> RecordDict:
    """An instruction's records: the global arrays, `ins` and the client's configuration."""
    config: dict[str, Any] = {ROUND: ins.round, LR: ins.lr, CLIENT_CONFIG: client_json}
    if ins.lambda_u is not None:
        config[LAMBDA_U] = ins.lambda_u
    if ins.global_prior is not None:
        config[GLOBAL_PRIOR] = [float(x) for x in ins.global_prior]
    if ins.partition is not None:
        config[PARTITION] = ins.partition
    records: dict[str, Any] = {"arrays": arrays, "config": ConfigRecord(config)}
    if ins.terms:
        records[TERMS] = ConfigRecord(dict(ins.terms))
    records.update({name: numpy_to_arrays(a) for name, a in ins.received.items()})
    return RecordDict(records)


def read_instruction(msg: Message, partition: int, seed: int) -> Instruction:
    """A train instruction as the client's trainer takes it (received arrays as torch tensors):
    for `partition`, its random streams seeded by `seed` (fssl.train.client_seed)."""
    conf = msg.content["config"]
    terms = msg.content.config_records.get(TERMS)
    prior = conf.get(GLOBAL_PRIOR)
    return Instruction(
        lr=float(conf[LR]),
        seed=seed,
        round=int(conf[ROUND]),
        lambda_u=float(conf[LAMBDA_U]) if conf.get(LAMBDA_U) is not None else None,
        partition=partition,
        received={
            name: arrays_to_torch(record)
            for name, record in msg.content.array_records.items()
            if name != "arrays"
        },
        terms=dict(terms) if terms is not None else {},
        global_prior=list(prior) if prior is not None else None,
    )


# -- client side ---------------------------------------------------------------------------------
# A method's own per-client figures (LocalTrainer.client_metrics) travel as `method:<name>`.
METHOD_METRIC = "method:"
METHOD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
MAX_METHOD_METRICS = 16


def train_reply(instruction: Message, arrays: ArrayRecord, metrics: dict[str, Any]) -> Message:
    """The reply to a train instruction: the trained state and the metrics (with Flower's
    `num-examples`, which its own strategies weigh by); the method's own figures (`method`,
    name -> number) as `method:<name>`."""
    for name, value in (metrics.pop("method", None) or {}).items():
        metrics[f"{METHOD_METRIC}{name}"] = float(value)
    metrics["num-examples"] = metrics["num_labeled"] + metrics["num_unlabeled"]
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=instruction)


MAX_TRACEBACK = 20_000  # characters of a client's traceback kept (replies are untrusted)
TRACE_MARK = "\n--- client traceback ---\n"  # between an error reply's reason and its traceback


def error_reply(instruction: Message, err: BaseException, trace: str) -> Message:
    """A ClientApp's failure as an error reply: the first line says what (`Type: message`), the
    rest is its traceback, which the server keeps in the run directory (client_errors.log)."""
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    reason = f"{type(err).__name__}: {err}".replace("\n", " ") + TRACE_MARK + trace
    return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=instruction)


def error_of(reply: Message) -> tuple[str, str]:
    """An error reply's reason in one line and the traceback after it (bounded): ours carry
    TRACE_MARK between them; Flower's own reasons (which may hold newlines) have no traceback."""
    text = str(reply.error.reason or "")
    reason, _, trace = text.partition(TRACE_MARK)
    return " ".join(reason.split())[:1000], trace[:MAX_TRACEBACK]


def node_info_reply(query: Message, info: dict[str, Any]) -> Message:
    return Message(content=RecordDict({"info": MetricRecord(info)}), reply_to=query)


# -- server side ---------------------------------------------------------------------------------
def parse_node_info(reply: Message) -> dict[str, Any]:
    """A node's answer to the start-up query: its partition, whether it holds its own data file,
    and when its process started and imported the ClientApp (0 when unknown)."""
    rec = reply.content.get("info")
    if not isinstance(rec, (MetricRecord, ConfigRecord)) or "partition-id" not in rec:
        raise ReplyError("the reply lacks the 'info' record with its 'partition-id'")
    try:
        return {
            "pid": int(rec["partition-id"]),
            "own-data": int(rec.get("own-data", 0)),
            "process-start": float(rec.get("process-start", 0.0)),
            "imported-at": float(rec.get("imported-at", 0.0)),
        }
    except (TypeError, ValueError) as err:
        raise ReplyError(f"the reply's 'info' record is malformed: {err}") from None


def parse_train_reply(
    msg: Message, global_arrays: dict[str, np.ndarray], num_classes: int, held: list[int] | None
) -> dict[str, Any]:
    """Arrays, metrics and APP-U of one train reply, checked against the global model the round
    sent and the partitions `held` by the replying node (None: not known); raises ReplyError."""
    content = msg.content
    if "arrays" not in content.array_records or "metrics" not in content.metric_records:
        raise ReplyError("reply lacks the 'arrays' ArrayRecord or the 'metrics' MetricRecord")
    arrays = arrays_to_numpy(content.array_records["arrays"])
    extra = sorted(set(arrays) - set(global_arrays))
    if extra:
        raise ReplyError(f"unexpected arrays {extra[:3]}")
    for key, ref in global_arrays.items():
        got = arrays.get(key)
        if got is None or got.shape != ref.shape or got.dtype != ref.dtype:
            found = "missing" if got is None else f"{got.dtype}{list(got.shape)}"
            raise ReplyError(f"array '{key}' is {found}, expected {ref.dtype}{list(ref.shape)}")
        if np.issubdtype(got.dtype, np.floating) and not np.isfinite(got).all():
            raise ReplyError(f"array '{key}' has non-finite values")
        # a negative running variance makes every later evaluation NaN (BatchNorm's sqrt), and a
        # norm bound that scales the update keeps it negative
        if key.endswith(STAT_SUFFIXES[1]) and (got < 0).any():
            raise ReplyError(f"array '{key}' has negative variances")
    metrics = dict(content.metric_records["metrics"])
    own = [k for k in metrics if k.startswith(METHOD_METRIC)]
    if len(own) > MAX_METHOD_METRICS:
        raise ReplyError(f"{len(own)} method metrics, more than {MAX_METHOD_METRICS}")
    bad = [k for k in own if not METHOD_NAME.fullmatch(k[len(METHOD_METRIC) :])]
    if bad:
        raise ReplyError(f"method metric names {bad[:3]} are not identifiers")
    for key in REQUIRED_COUNTS:
        if not isinstance(metrics.get(key), int) or metrics[key] < 0:
            raise ReplyError(f"metric '{key}' missing or not a non-negative integer")
    if held is not None and metrics["partition_id"] not in held:
        raise ReplyError(
            f"claims partition {metrics['partition_id']} but the node was sent "
            f"{held if len(held) > 1 else held[0]}"
        )
    app_u = np.asarray(metrics.get("app_u", []), dtype=np.float64).reshape(-1)
    if app_u.shape != (num_classes,):
        raise ReplyError(f"app_u has length {app_u.size}, expected {num_classes}")
    if not np.isfinite(app_u).all() or (app_u < 0).any() or abs(app_u.sum() - 1) > 1e-3:
        raise ReplyError("app_u must be finite, non-negative and sum to 1")
    return {"arrays": arrays, "metrics": metrics, "app_u": app_u}


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
        # by true class (simulation: the hidden labels known), over the images that weigh in
        "pseudo_label_class_true": [int(x) for x in _floats(metrics, "pseudo_label_class_true")],
        "pseudo_label_class_correct": [
            int(x) for x in _floats(metrics, "pseudo_label_class_correct")
        ],
        "loss_sup": _num(metrics, "loss_sup"),
        "loss_unsup": _num(metrics, "loss_unsup"),
        "train_seconds": _num(metrics, "train_seconds"),
        "setup_seconds": _num(metrics, "setup_seconds"),
        "reply_seconds": _num(metrics, "reply_seconds"),
        # a deployed node's message process: its start and imports, the relay to its worker
        "process_seconds": _num(metrics, "process_seconds"),
        "relay_seconds": _num(metrics, "relay_seconds"),
        # the method's own figures (LocalTrainer.client_metrics); a non-finite value as null
        "method": {
            k[len(METHOD_METRIC) :]: _num(metrics, k)
            for k in sorted(metrics)
            if k.startswith(METHOD_METRIC)
        },
    }

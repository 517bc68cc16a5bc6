"""Flower's own strategies, or a user's, against the project's clients (`strategy=<name>`).

The project keeps what its clients and its comparisons need: partitions sampled by (seed, round),
the instructions, reply intake (strategy/intake.py), the norm bound of `server.robust.clip`, the
per-round records, central evaluation and checkpoints. The chosen strategy decides the rest:
- `configure_train` is called every round on a grid that holds just the round's sampled nodes: its
  state is kept up to date (FedOpt's and QFedAvg's current arrays) and every key it puts in its
  ConfigRecord reaches the clients as the instruction's terms (FedProx's `proximal-mu`).
- `aggregate_train` gets one reply per valid client: `arrays` (the trained parameters; BatchNorm
  running statistics and integer buffers stay with the project, averaged with the same weights) and
  `metrics`, whose `num-examples` is the client's aggregation weight: DMA's beta when the method
  uses DMA (FedDB), else `server.weighting`'s (uniform or n_m), so any weighted-averaging strategy
  composes with DMA. Also there: `train_loss` (the received model's labeled loss, QFedAvg's),
  `app_u`, `num_labeled`, `num_unlabeled`, `partition_id`, `loss_sup`, `loss_unsup`.
The project's server momentum (`server.momentum`) is not applied: the strategy's aggregate_train
is the update step (InnerUpdate).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fssl.checks import ConfigError, choice, mapping
from fssl.methods import method_class
from fssl.plugins import load

from .base import MethodStrategy, ServerSetup
from .contract import STAT_SUFFIXES, arrays_to_numpy
from .update import ServerUpdate

FLOWER = {
    "fedavg": "FedAvg",
    "fedavgm": "FedAvgM",
    "fedprox": "FedProx",
    "fedadam": "FedAdam",
    "fedyogi": "FedYogi",
    "fedadagrad": "FedAdagrad",
    "fedmedian": "FedMedian",
    "fedtrimmedavg": "FedTrimmedAvg",
    "krum": "Krum",
    "multikrum": "MultiKrum",
    "bulyan": "Bulyan",
    "qfedavg": "QFedAvg",
}
# Strategies whose aggregate ignores the per-client weights (so DMA cannot steer them).
UNWEIGHTED = {"fedmedian", "fedtrimmedavg", "bulyan", "qfedavg"}
REPLY_METRICS = (
    "train_loss",
    "num_labeled",
    "num_unlabeled",
    "partition_id",
    "loss_sup",
    "loss_unsup",
)


class StrategyError(ValueError):
    """The configured strategy cannot be loaded or used; the message says why and what to do."""


class StrategyFailed(RuntimeError):
    """A user's or Flower's strategy raised in one of its hooks during the run; the message
    names the class and the hook."""


def call(inner: Strategy, hook: str, *args: Any) -> Any:
    """`inner.<hook>(*args)`, an exception in it named by class and hook (StrategyFailed)."""
    try:
        return getattr(inner, hook)(*args)
    except Exception as err:  # noqa: BLE001 - the strategy is the user's code
        raise StrategyFailed(
            f"strategy {type(inner).__name__}.{hook} raised {type(err).__name__}: {err}"
        ) from err


def load_class(target: str) -> type:
    """`package.module:Class` (or `/path/file.py:Class`, or `package.module.Class`) -> the class,
    found by fssl.plugins (as every user's class is) and checked to be a Flower message-API
    Strategy with its training hooks."""
    if target and ":" not in target and "." in target:
        module, _, attr = target.rpartition(".")
        target = f"{module}:{attr}"
    try:
        cls = load(target, f"strategy.target '{target}'")
    except ConfigError as err:
        raise StrategyError(str(err)) from None
    if not (inspect.isclass(cls) and issubclass(cls, Strategy)):
        raise StrategyError(
            f"strategy.target '{target}' is not a subclass of "
            "flwr.serverapp.strategy.Strategy (the message API)"
        )
    missing = sorted(getattr(cls, "__abstractmethods__", set()))
    if missing:
        raise StrategyError(
            f"strategy.target '{target}' does not implement {missing}: a "
            "Strategy needs configure_train, aggregate_train, configure_evaluate, "
            "aggregate_evaluate, summary"
        )
    return cls


def check_choice(cfg: dict[str, Any]) -> None:
    """`strategy`: the method's own, one of Flower's, or a user's class by import path, checked
    before anything runs (a user's class is imported)."""
    scfg = {"strategy": cfg.get("strategy") or {"name": "method"}}
    name = choice(scfg, "strategy.name", ("method", *FLOWER, "custom"), default=None)
    if name == "method":
        return
    mapping(
        scfg,
        "strategy.params",
        default=None,
        nullable=True,
        note="of the strategy's keyword arguments",
    )
    scenario = (cfg.get("scenario") or {}).get("name", "labels_at_clients")
    if name == "qfedavg" and scenario != "labels_at_clients":
        raise ConfigError(
            "strategy=qfedavg weighs each client by its loss on its labels, and in scenario "
            f"{scenario} clients hold none: use another strategy, or labels_at_clients"
        )
    own = method_class(cfg["method"]["trainer"]).server.own_aggregation
    if own:
        raise ConfigError(
            f"method '{cfg['method']['name']}' needs its own server side ({own}); "
            f"strategy={name} cannot replace it. Use strategy=method, or a method whose server "
            "side only averages"
        )
    choice(
        cfg,
        "server.robust.rule",
        ("mean",),
        note=f"with strategy={name} (the strategy "
        "aggregates; choose strategy=fedmedian, fedtrimmedavg, krum, multikrum or bulyan "
        "for a robust rule)",
    )
    try:  # built once here, so that a constructor that fails stops the run before it starts
        build_inner(scfg["strategy"])
    except StrategyError as err:
        raise ConfigError(str(err)) from err


def build_inner(scfg: dict[str, Any]) -> Strategy:
    """The configured Flower or user strategy, sampling every node it is shown."""
    name = scfg["name"]
    if name == "custom":
        cls = load_class(str(scfg.get("target") or ""))
    else:
        import flwr.serverapp.strategy as fs

        cls = getattr(fs, FLOWER[name])
    params = dict(scfg.get("params") or {})
    accepted = inspect.signature(cls.__init__).parameters
    for key, value in (
        ("fraction_train", 1.0),
        ("fraction_evaluate", 0.0),
        ("min_train_nodes", 1),
        ("min_evaluate_nodes", 1),
        ("min_available_nodes", 1),
    ):
        if key in accepted and key not in params:
            params[key] = value
    try:
        return cls(**params)
    except TypeError as err:
        raise StrategyError(
            f"strategy '{name}' cannot be built with strategy.params {sorted(params)}: {err}"
        ) from err
    except Exception as err:  # noqa: BLE001 - a user's constructor
        raise StrategyError(
            f"strategy '{name}': {cls.__name__}.__init__ raised {type(err).__name__}: {err} "
            f"(strategy.params {sorted(params)})"
        ) from err


class SampledNodes:
    """A Grid stand-in for the inner strategy's configure_train: the round's sampled nodes."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)


def trained_keys(arrays: dict[str, np.ndarray]) -> list[str]:
    """The arrays a strategy aggregates: trained floats (not BatchNorm's running statistics)."""
    return [
        k
        for k, v in arrays.items()
        if np.issubdtype(v.dtype, np.floating) and not k.endswith(STAT_SUFFIXES)
    ]


class FlowerStrategy(MethodStrategy):
    """The project's round around a Flower (or user) strategy: its configure_train gives the
    clients' terms, its aggregate_train is the update step (InnerUpdate)."""

    def __init__(
        self, cfg: dict[str, Any], num_classes: int, setup: ServerSetup | None = None
    ) -> None:
        super().__init__(cfg, num_classes, setup)
        self.inner = build_inner(cfg["strategy"])
        self.inner_config: dict[str, Any] = {}
        self.update = InnerUpdate(self.inner, cfg, self.setup)

    def client_terms(self) -> dict[str, Any]:
        """Every key the strategy put in its ConfigRecord (FedProx's `proximal-mu`)."""
        return dict(self.inner_config)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        global_arrays = arrays_to_numpy(arrays)
        pids = self.sampler.sample(server_round, self.cfg["fl"]["fraction_train"])
        self.inner_config = {}
        if pids:  # else no client has anything to learn (labels at the server): nothing to send
            node_of = self.intake.node_of
            nodes = sorted({node_of[p] for p in pids if p in node_of}) if node_of else [0]
            trained = ArrayRecord(
                {
                    k: Array(np.ascontiguousarray(global_arrays[k]))
                    for k in trained_keys(global_arrays)
                }
            )
            sent = list(
                call(
                    self.inner,
                    "configure_train",
                    server_round,
                    trained,
                    ConfigRecord(),
                    SampledNodes(nodes),
                )
            )
            for record in sent[0].content.config_records.values() if sent else []:
                self.inner_config.update({k: v for k, v in record.items() if k != "server-round"})
        return super().configure_train(server_round, arrays, config, grid)


class InnerUpdate(ServerUpdate):
    """The update step of a Flower (or user) strategy: the project's defences (the norm bound,
    the agreement filter), then the strategy's aggregate_train on the kept replies, their weights
    as `num-examples`; BatchNorm running statistics and integer buffers stay with the project."""

    def __init__(self, inner: Strategy, cfg: dict[str, Any], setup: ServerSetup) -> None:
        super().__init__(cfg, setup.workers, setup.audit, setup.audit_workers)
        self.inner = inner

    def inner_replies(
        self,
        keys: list[str],
        parsed: list[dict[str, Any]],
        client_arrays: list[dict],
        weights: np.ndarray,
    ) -> list[Message]:
        out = []
        for p, arrays, w in zip(parsed, client_arrays, weights):
            m = p["metrics"]
            metrics: dict[str, Any] = {"num-examples": float(w), "app_u": p["app_u"].tolist()}
            metrics.update({k: m[k] for k in REPLY_METRICS if isinstance(m.get(k), (int, float))})
            content = RecordDict(
                {
                    "arrays": ArrayRecord(
                        {k: Array(np.ascontiguousarray(arrays[k])) for k in keys}
                    ),
                    "metrics": MetricRecord(metrics),
                }
            )
            out.append(Message(content=content, dst_node_id=0, message_type=MessageType.TRAIN))
        return out

    def combine(self, old, replies, client_arrays, weights, record, residual):
        kept = (record.robust or {}).get("selected")  # server.robust.min_cosine
        parsed = [replies[i] for i in kept] if kept is not None else replies
        name = self.cfg["strategy"]["name"]
        record.strategy = {"name": name, "weights_used": name not in UNWEIGHTED}
        result, _ = call(
            self.inner,
            "aggregate_train",
            record.round,
            self.inner_replies(trained_keys(old), parsed, client_arrays, weights),
        )
        if result is None:
            raise StrategyFailed(
                f"strategy {type(self.inner).__name__}.aggregate_train returned no arrays"
            )
        new_trained = arrays_to_numpy(result)
        new: dict[str, np.ndarray] = {}
        total = float(np.sum(weights)) or 1.0
        for key, current in old.items():
            if key in new_trained:
                new[key] = new_trained[key].astype(current.dtype).reshape(current.shape)
            elif np.issubdtype(current.dtype, np.floating):  # BatchNorm running statistics
                new[key] = sum(
                    w / total * a[key].astype(np.float64) for w, a in zip(weights, client_arrays)
                ).astype(current.dtype)
            else:  # e.g. num_batches_tracked
                new[key] = np.max([a[key] for a in client_arrays], axis=0).astype(current.dtype)
        return new

    # -- checkpoints -----------------------------------------------------------------------
    def state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """The inner strategy's arrays (dicts or lists of arrays, ArrayRecords) and scalars;
        what is neither is named in the checkpoint, and a resume says it starts afresh."""
        arrays: dict[str, Any] = {}
        saved: dict[str, Any] = {}
        unsaved = []
        for name, value in vars(self.inner).items():
            kind, packed = pack(value)
            if kind in ("arrays", "list", "array_record"):
                arrays[f"inner_{name}"] = packed
                saved[name] = kind
            elif kind == "scalar":
                saved[name] = ["scalar", packed]
            elif value is not None and not callable(value):
                unsaved.append(name)
        return arrays, {"inner": saved, "inner_unsaved": unsaved}

    def load_state(self, arrays: dict[str, dict[str, np.ndarray]], state: dict[str, Any]) -> None:
        for name, kind in state.get("inner", {}).items():
            if isinstance(kind, list):
                setattr(self.inner, name, kind[1])
            elif kind == "arrays":
                setattr(self.inner, name, dict(arrays[f"inner_{name}"]))
            elif kind == "list":
                packed = arrays[f"inner_{name}"]
                setattr(self.inner, name, [packed[str(i)] for i in range(len(packed))])
            elif kind == "array_record":
                setattr(
                    self.inner,
                    name,
                    ArrayRecord(
                        {
                            k: Array(np.ascontiguousarray(v))
                            for k, v in arrays[f"inner_{name}"].items()
                        }
                    ),
                )
        if state.get("inner_unsaved"):
            log(
                WARNING,
                "resume: strategy '%s' kept state the checkpoint cannot hold (%s); these "
                "start afresh, so the resumed run is not the uninterrupted one",
                self.cfg["strategy"]["name"],
                ", ".join(state["inner_unsaved"]),
            )


def pack(value: Any) -> tuple[str, Any]:
    """How a strategy attribute goes into a checkpoint: ('arrays', dict), ('list', dict),
    ('array_record', dict), ('scalar', value) or ('', None) when it cannot."""
    if isinstance(value, ArrayRecord):
        return "array_record", arrays_to_numpy(value)
    if isinstance(value, dict) and value and all(isinstance(v, np.ndarray) for v in value.values()):
        return "arrays", {str(k): v for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
        return "list", {str(i): v for i, v in enumerate(value)}
    if isinstance(value, (bool, int, float, str)):
        return "scalar", value
    return "", None

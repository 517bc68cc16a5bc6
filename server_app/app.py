"""ServerApp: resolves the configuration, writes the run directory, binds nodes to partitions,
runs the strategy with central evaluation (evaluation.py) every round, and prints a summary."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fssl import checkpoint, identity
from fssl.config import DEFENCES, apply_defence_scope, warmup_note
from fssl.methods import make_model, method_class
from fssl.partition import partition_label, save_partition, scenario_of
from fssl.profiling import Timeline, profiled
from fssl.provenance import provenance
from fssl.runtime import (
    cores,
    cpu_threads,
    data_meta,
    dataset_for,
    keep_freed_memory,
    partition_for,
)
from fssl.server_train import ServerLabels
from fssl.train import resolve_device
from strategy import MethodStrategy, ServerSetup, make_strategy
from strategy.contract import arrays_to_numpy, numpy_to_arrays
from strategy.flower import StrategyFailed

from .config import resolve
from .evaluation import GlobalEvaluation
from .nodes import RejoinedNodes, bind_partitions, simulated
from .recorder import RoundRecorder
from .rounds import FAILURE, RUN_SKIPPED, RoundLoop, RunFailed, failed_before, skipped_note

app = ServerApp()
STATE = "feddb"  # the context's state record with the run directory and the skipped rounds


def run_dir_for(cfg: dict[str, Any]) -> Path:
    out = cfg["output_dir"] or (
        f"runs/{datetime.now():%Y%m%d-%H%M%S}_{cfg['method']['name']}_{cfg['dataset']['name']}_"
        f"{partition_label(cfg['partition'])}_s{cfg['seed']}"
    )
    path = Path(out).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


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


@app.main()
@profiled("server")
def main(grid: Grid, context: Context) -> None:
    timeline = Timeline()
    keep_freed_memory()
    cfg, resume_dir = resolve(dict(context.run_config))
    simulation = simulated(grid)
    scope_defences(cfg, simulation)
    run_dir = open_run_dir(cfg, context, resume_dir)
    context.state[STATE] = ConfigRecord({"run_dir": str(run_dir)})  # for an in-process caller
    device = resolve_device(cfg["device"])
    threads = set_threads(cfg, grid, device)
    ds, part = load_data(cfg, run_dir, fresh=resume_dir is None)
    record_identity(cfg, context, run_dir, ds, resume_dir)
    timeline.mark("data_ready")
    fl = cfg["fl"]
    node_of = bind_partitions(
        grid, fl["num_clients"], fl["node_wait"], timeline, min_nodes=fl["min_train_clients"]
    )
    timeline.mark("nodes_bound")

    method = method_class(cfg["method"]["trainer"])  # once: model, strategy, server labels
    torch.manual_seed(cfg["seed"])
    np.random.seed(cfg["seed"])
    model = make_model(cfg, ds.num_classes, ds.image_shape[0], method)
    evaluation = GlobalEvaluation(cfg, ds, model, device)
    recorder = RoundRecorder(cfg, evaluation, run_dir)
    idle_cores = threads == 1 and device.type == "cpu"
    audit = loss_check(cfg, evaluation, idle_cores)
    setup = server_setup(cfg, ds, part, node_of, simulation, audit, method)
    strategy = make_strategy(cfg, ds.num_classes, setup)
    arrays, first_round = starting_point(model, run_dir, resume_dir, strategy, recorder, grid)
    loop = RoundLoop(strategy, grid, server_labels(cfg, ds, part, device, strategy, method))
    loop.failed = failed_before(recorder.history) if resume_dir is not None else []
    if not simulation:  # SuperNodes may leave and join during the run
        loop.before_round = RejoinedNodes(grid, strategy, fl["num_clients"])
    saver = Saver(cfg, run_dir, timeline, loop, strategy, recorder)
    arrays = run_rounds(loop, arrays, first_round, recorder, saver, run_dir, resume_dir)
    torch.save(arrays.to_torch_state_dict(), run_dir / "final_model.pt")
    if loop.failed:
        fail(run_dir, loop, recorder)
    print_done(recorder.summary(), run_dir, context)


# config.yaml holds each switch twice: what the run used, and the method's default beside it
CONFIG_HEAD = (
    "# The run's resolved configuration. It ran with DPL as `dpl` says and DMA as `dma.enabled`\n"
    "# says; `method.dpl` and `method.dma` are only the method's defaults (they name its variant).\n"
)


def open_run_dir(cfg: dict[str, Any], context: Context, resume_dir: Path | None) -> Path:
    """The run directory, its configuration and provenance written when the run is new; the
    run's one-line description and the warm-up warning printed."""
    run_dir = resume_dir or run_dir_for(cfg)
    if resume_dir is None:
        (run_dir / "config.yaml").write_text(CONFIG_HEAD + yaml.safe_dump(cfg, sort_keys=False))
        (run_dir / "run_config.json").write_text(json.dumps(dict(context.run_config), indent=2))
        (run_dir / "provenance.json").write_text(json.dumps(provenance(cfg["device"]), indent=2))
    print(
        f"[feddb] method={cfg['method']['name']} dpl={cfg['dpl']} dma={cfg['dma']['enabled']} "
        f"dataset={cfg['dataset']['name']} partition={partition_label(cfg['partition'])} "
        f"model={cfg['model']['name']} rounds={cfg['num_rounds']} run_dir={run_dir}",
        flush=True,
    )
    note = warmup_note(cfg)
    if note:
        print(f"[feddb] warning: {note}", flush=True)
    return run_dir


def record_identity(cfg, context: Context, run_dir: Path, ds, resume_dir: Path | None) -> None:
    """A new run writes what it is (identity.json) before its first round; a resumed one must
    still be that run: its configuration and data as recorded."""
    if resume_dir is None:
        identity.write(run_dir, identity.make(cfg, dict(context.run_config), ds))
    else:
        identity.check_resume(run_dir, cfg, ds)


def set_threads(cfg: dict[str, Any], grid: Grid, device: torch.device) -> int | None:
    threads = server_threads(cfg["eval"].get("threads", "auto"), grid, device)
    if threads is not None:
        torch.set_num_threads(threads)
    return threads


def load_data(cfg: dict[str, Any], run_dir: Path, fresh: bool):
    """The dataset (its shape and normalisation into cfg["data_meta"] for the clients) and its
    partition, saved with the run when it is new."""
    ds = dataset_for(cfg)
    cfg["data_meta"] = data_meta(ds)
    part = partition_for(cfg)
    if fresh:
        save_partition(part, ds.y_train, run_dir, cfg)
    return ds, part


def server_setup(
    cfg, ds, part, node_of, simulation: bool, audit: dict[str, Any], method: type
) -> ServerSetup:
    """What the strategy knows of the run: nodes, partition sizes, the loss check's evaluation."""
    return ServerSetup(
        node_of=node_of,
        simulated=simulation,
        max_samples=len(ds.y_train),
        partition_sizes=[(len(lab), len(unl)) for lab, unl in zip(part.labeled, part.unlabeled)],
        workers=cores(),  # the replies are all in: no client is busy meanwhile
        method=method,
        **audit,
    )


def starting_point(
    model, run_dir: Path, resume_dir: Path | None, strategy: MethodStrategy, recorder, grid: Grid
) -> tuple[ArrayRecord, int]:
    """The initial model and round 1, or the checkpoint's model and the round after it."""
    if resume_dir is None:
        return ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()}), 1
    arrays, first_round = restore(run_dir, strategy, recorder, grid)
    print(f"[feddb] resumed from the checkpoint of round {first_round - 1}", flush=True)
    (run_dir / FAILURE).unlink(missing_ok=True)  # written again if a round fails
    return arrays, first_round


def server_labels(
    cfg, ds, part, device, strategy: MethodStrategy, method: type
) -> ServerLabels | None:
    """The server's own labeled training (labels_at_server scenarios), said in one line."""
    if not len(part.server):
        return None
    server = ServerLabels(cfg, ds, part, device, method)
    print(
        f"[feddb] {scenario_of(cfg)[0]}: the server trains on its {server.size} labeled "
        f"images every round ({strategy.server_step}"
        + (", static BatchNorm" if server.static_bn else "")
        + "); the clients hold unlabeled images only",
        flush=True,
    )
    return server


class Saver:
    """After each round: the start-up timeline once, and a checkpoint every `checkpoint.every`
    rounds and after the last."""

    def __init__(self, cfg, run_dir: Path, timeline: Timeline, loop, strategy, recorder) -> None:
        self.cfg, self.run_dir, self.timeline, self.loop = cfg, run_dir, timeline, loop
        self.strategy, self.recorder = strategy, recorder

    def __call__(self, server_round: int, current: ArrayRecord) -> None:
        if not self.timeline.written:
            self.timeline.marks["first_round_sent"] = self.loop.first_push_time
            self.timeline.mark("first_round_done")
            self.timeline.write(self.run_dir / "startup.json")
        every = self.cfg["checkpoint"]["every"]
        if server_round == self.cfg["num_rounds"] or (every and server_round % every == 0):
            nodes = getattr(self.loop.grid, "node_states", None)  # in process: the nodes' state
            save_checkpoint(
                self.run_dir, server_round, current, self.strategy, self.recorder, nodes
            )


def run_rounds(loop, arrays, first_round, recorder, saver, run_dir, resume_dir) -> ArrayRecord:
    """The rounds, with Flower's own per-round log lines hushed (one progress line a round
    instead); a strategy that raises ends the run as failed."""
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)
    try:
        return loop.run(arrays, first_round, recorder, saver, evaluate_first=resume_dir is None)
    except StrategyFailed as err:
        loop.failed.insert(0, str(err))
        fail(run_dir, loop, recorder)
    finally:
        flwr_logger.setLevel(level)
        recorder.close()


def print_done(s: dict[str, Any], run_dir: Path, context: Context) -> None:
    """The run's result, its directory, and last the rounds it skipped (the launchers' exit 4),
    in its log and for an in-process caller in the context's state."""
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
    note = skipped_note(s)
    if note:
        context.state[STATE]["skipped"] = note
        print(f"{RUN_SKIPPED} {note}", flush=True)


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


def loss_check(
    cfg: dict[str, Any], evaluation: GlobalEvaluation, idle_cores: bool
) -> dict[str, Any]:
    """The loss check's evaluation for the strategy (server.robust.loss_check): the validation
    loss of a candidate model, on all cores when the clients wait idle meanwhile (a simulation
    on a CPU)."""
    if cfg["server"]["robust"]["loss_check"] is None:
        return {}
    if not evaluation.has_val:
        print(
            "[feddb] WARNING: server.robust.loss_check is off in this run: the dataset has no "
            "validation split to check updates on (set dataset.val_size > 0, or "
            "server.robust.loss_check=null)",
            flush=True,
        )
        return {}
    return {"audit": evaluation.audit_loss, "audit_workers": cores() if idle_cores else 1}


def save_checkpoint(
    run_dir: Path,
    server_round: int,
    arrays: ArrayRecord,
    strategy: MethodStrategy,
    recorder: RoundRecorder,
    node_states: Callable[[], dict[str, dict[str, np.ndarray]]] | None = None,
) -> None:
    """Global model, strategy state (momentum buffer, caches), RNG states, recorder state, and
    where the nodes run in this process (`node_states`) what each keeps between rounds."""
    strategy_arrays, strategy_state = strategy.state()
    np_state = np.random.get_state()
    nodes = node_states() if node_states is not None else {}
    checkpoint.save(
        run_dir,
        {
            "global": arrays_to_numpy(arrays),
            "rng": {"torch": torch.get_rng_state().numpy()},
            **{f"strategy.{k}": v for k, v in strategy_arrays.items()},
            **{f"node.{k}": v for k, v in nodes.items()},
        },
        {
            "nodes": node_states is not None,
            "round": server_round,
            "run": (identity.read(run_dir) or {}).get("run"),
            "strategy": strategy_state,
            "recorder": recorder.state(),
            "numpy_rng": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        },
    )


def restore(
    run_dir: Path, strategy: MethodStrategy, recorder: RoundRecorder, grid: Grid
) -> tuple[ArrayRecord, int]:
    file, note = checkpoint.find(run_dir)
    if note:  # the latest is corrupt: kept aside (not overwritten by the next save), and said
        print(f"[feddb] {note}", flush=True)
        for path in (run_dir / checkpoint.FILE, run_dir / f"{checkpoint.FILE}.sha256"):
            if path.is_file():
                path.replace(path.with_name(path.name.replace("checkpoint", "checkpoint.corrupt")))
    groups, state = checkpoint.load(run_dir, file)
    identity.check_checkpoint(run_dir, state)
    strategy.load_state(
        {k.split(".", 1)[1]: v for k, v in groups.items() if k.startswith("strategy.")},
        state["strategy"],
    )
    recorder.restore(state["round"], state["recorder"])
    if state.get("nodes") and hasattr(grid, "load_node_states"):
        grid.load_node_states(
            {k.split(".", 1)[1]: v for k, v in groups.items() if k.startswith("node.")}
        )
    torch.set_rng_state(torch.from_numpy(groups["rng"]["torch"]))
    kind, keys, *rest = state["numpy_rng"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    return numpy_to_arrays(groups["global"]), state["round"] + 1

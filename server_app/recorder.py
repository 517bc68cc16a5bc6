"""Central evaluation (every `eval.every` rounds) and the run directory: metrics.jsonl, progress
lines, summary; TensorBoard, and MLflow / W&B when configured (tracking.py)."""

from __future__ import annotations

import copy
import json
import math
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord

from fssl.data import Dataset
from fssl.metrics import class_accuracy, js_divergence, normalise, prediction_stats
from fssl.train import evaluate, to_nchw
from strategy import RoundRecord
from strategy.contract import arrays_to_torch

from .tracking import Tracking

# the method's server-side notes every round record carries, null by default, so that every
# run's metrics.jsonl has the same keys: the groups it averaged by, the helpers it sent each client
NOTE_KEYS = ("groups", "helpers")


def method_notes(notes: dict[str, Any]) -> dict[str, Any]:
    """What the method's server side noted this round (fssl.methods.base.MethodServer.notes): NOTE_KEYS
    at the top of the record, anything else under `method_notes`, where it cannot replace a key
    of the record."""
    out: dict[str, Any] = {key: notes.get(key) for key in NOTE_KEYS}
    rest = {k: v for k, v in notes.items() if k not in NOTE_KEYS}
    if rest:
        out["method_notes"] = rest
    return out


# a round whose global model is not evaluated (eval.every > 1): its record has these as null
NOT_EVALUATED = dict.fromkeys(
    (
        "test_loss",
        "test_accuracy",
        "val_loss",
        "val_accuracy",
        "class_accuracy",
        "top_class_share",
        "prediction_entropy",
        "collapsed",
        "predicted_histogram",
        "ece",
        "mean_confidence",
    )
)


def deferred(value: Any) -> Any:
    """A diagnostic the strategy left to compute when the round is recorded (off the critical
    path), or a value."""
    return value() if callable(value) else value


class RoundRecorder:
    """The round loop's `evaluate_fn` (server_app/rounds.py): evaluates the global model (on the
    rounds `due`) and appends one JSON line a round."""

    def __init__(
        self,
        cfg: dict[str, Any],
        ds: Dataset,
        model: torch.nn.Module,
        run_dir: Path,
        device: torch.device,
    ) -> None:
        self.cfg, self.ds, self.model = cfg, ds, model.to(device)
        self.run_dir, self.device = run_dir, device
        self.x_test = to_nchw(ds.x_test, device)
        self.y_test = torch.from_numpy(ds.y_test).to(device)
        self.has_val = ds.x_val is not None and len(ds.x_val) > 0
        if self.has_val:
            self.x_val = to_nchw(ds.x_val, device)
            self.y_val = torch.from_numpy(ds.y_val).to(device)
        self.metrics_file = run_dir / "metrics.jsonl"
        # on an accelerator the global model is evaluated as clients train: bf16, channels_last
        self.fast = device.type != "cpu" and cfg["train"]["precision"] in ("auto", "bf16")
        self.prev_class_acc: np.ndarray | None = None
        self.resumed_from: int | None = None
        self.history: list[dict[str, Any]] = []
        self.t_last = time.perf_counter()
        self.t_start = self.t_last
        self.write_seconds = 0.0
        self.tb = None  # TensorBoard writer, opened at the first round written
        self.tracking = Tracking(cfg, run_dir)  # MLflow, W&B: a run opened at the first round
        self.audit_models: queue.SimpleQueue[torch.nn.Module] = queue.SimpleQueue()

    def tensorboard(self, record: dict[str, Any]) -> None:
        """Scalars of one round in run_dir/tensorboard (`tensorboard --logdir runs/`)."""
        if not self.cfg["logging"]["tensorboard"]:
            return
        if self.tb is None:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run rewrites the rounds after its checkpoint: purge them from the events
            self.tb = SummaryWriter(
                str(self.run_dir / "tensorboard"),
                purge_step=record["round"] if self.resumed_from else None,
            )
        clients = record["clients"]
        mean = lambda key: (
            float(np.mean([c[key] for c in clients if c.get(key) is not None]))  # noqa: E731
            if any(c.get(key) is not None for c in clients)
            else None
        )
        dma = record.get("dma") or {}
        scalars = {
            "test/accuracy": record["test_accuracy"],
            "test/loss": record["test_loss"],
            "train/loss_sup": mean("loss_sup"),
            "train/loss_unsup": mean("loss_unsup"),
            "pseudo_labels/accuracy": record["pseudo_label_accuracy"],
            "pseudo_labels/ratio": record["pseudo_label_ratio"],
            "val/accuracy": record["val_accuracy"],
            "collapse/top_class_share": record["top_class_share"],
            "collapse/prediction_entropy": record["prediction_entropy"],
            "calibration/ece": record["ece"],
            "bias/js_app_u": record["js_divergence"],
            "bias/js_labeled": record["js_divergence_labeled"],
            "aggregation/gradient_diversity": record["gradient_diversity"],
            "aggregation/dma_loss_uniform": dma.get("loss_uniform"),
            "aggregation/dma_loss_weights": dma.get("loss_weights"),
            "aggregation/dma_weight_entropy": dma.get("weight_entropy"),
            "time/round_seconds": record["round_seconds"],
            "failures": record["num_failures"],
        }
        for tag, value in scalars.items():
            if value is not None and math.isfinite(value):
                self.tb.add_scalar(tag, value, record["round"])
        self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        # a run stopped before its last round ends its tracked runs here; a complete one at
        # summary(), which the ServerApp calls after this
        last = self.history[-1]["round"] if self.history else 0
        self.tracking.close(complete=last >= self.cfg["num_rounds"])

    def evaluate(self, arrays: ArrayRecord) -> dict[str, Any]:
        """Test loss, accuracy, class-wise accuracy, collapse signal and calibration; validation
        loss and accuracy when the dataset holds a validation split."""
        self.model.load_state_dict(arrays_to_torch(arrays))
        bs, k = self.cfg["eval"]["batch_size"], self.ds.num_classes
        loss, acc, pred, conf = evaluate(
            self.model, self.x_test, self.y_test, self.ds.mean, self.ds.std, bs, self.fast
        )
        out = {
            "test_loss": loss,
            "test_accuracy": acc,
            "class_accuracy": class_accuracy(pred, self.ds.y_test, k),
            **prediction_stats(pred, conf, self.ds.y_test, k),
        }
        if self.has_val:
            out["val_loss"], out["val_accuracy"], _, _ = evaluate(
                self.model, self.x_val, self.y_val, self.ds.mean, self.ds.std, bs, self.fast
            )
        return out

    def audit_loss(self, arrays: dict[str, np.ndarray]) -> float:
        """Validation loss of a candidate global model on the split's first
        `server.robust.loss_check_size` images (the loss check of strategy/robust.py).
        Thread-safe: each call takes a model of its own from a pool (copies of the global one)."""
        n = self.cfg["server"]["robust"]["loss_check_size"]
        try:
            model = self.audit_models.get_nowait()
        except queue.Empty:
            model = copy.deepcopy(self.model)
        try:
            model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()})
            return evaluate(
                model,
                self.x_val[:n],
                self.y_val[:n],
                self.ds.mean,
                self.ds.std,
                self.cfg["eval"]["batch_size"],
                self.fast,
            )[0]
        finally:
            self.audit_models.put(model)

    def due(self, server_round: int) -> bool:
        """Round t's global model is evaluated: every `eval.every` rounds, round 0 and the last."""
        every = self.cfg["eval"].get("every", 1)
        return server_round % every == 0 or server_round >= self.cfg["num_rounds"]

    def __call__(
        self, server_round: int, arrays: ArrayRecord, info: RoundRecord | None
    ) -> MetricRecord:
        """Evaluate round t's global model and write its record (`info`: what the strategy did;
        None for the model a run starts from, round first_round - 1)."""
        t0 = time.perf_counter()
        ev = self.evaluate(arrays) if self.due(server_round) else NOT_EVALUATED
        loss, acc, cls_acc = ev["test_loss"], ev["test_accuracy"], ev["class_accuracy"]
        now = time.perf_counter()
        seconds, self.t_last = now - self.t_last, now  # the whole cycle since the last one
        if info is not None:
            info.timing.update({"evaluate": now - t0, "record_previous_round": self.write_seconds})
            self.write(server_round, ev, seconds, info)
        else:
            self.metrics_file.write_text("")
            print(f"[feddb] round   0  initial test acc {acc:.4f}", flush=True)
        self.prev_class_acc = cls_acc  # None after a round not evaluated: no JS divergence next
        self.write_seconds = time.perf_counter() - now  # metrics.jsonl, TensorBoard, the line
        return MetricRecord({"test_accuracy": acc, "test_loss": loss} if acc is not None else {})

    def write(
        self, server_round: int, ev: dict[str, Any], seconds: float, info: RoundRecord
    ) -> None:
        loss, acc, cls_acc = ev["test_loss"], ev["test_accuracy"], ev["class_accuracy"]
        clients = info.clients
        target = self.prev_class_acc  # class-wise accuracy of the model the clients received
        js_app, js_lab = [], []
        k = self.ds.num_classes
        for c in clients:
            if target is not None and len(c["app_u_global"]) == k:
                c["js_app_u"] = js_divergence(c["app_u_global"], target)
                js_app.append(c["js_app_u"])
            if target is not None and len(c["labeled_histogram"]) == k:
                c["js_labeled"] = js_divergence(c["labeled_histogram"], target)
                js_lab.append(c["js_labeled"])
        pl_acc = [
            c["pseudo_label_accuracy"] for c in clients if c["pseudo_label_accuracy"] is not None
        ]
        pl_hists = [
            c["pseudo_label_histogram"]
            for c in clients
            if len(c.get("pseudo_label_histogram", [])) == k
        ]
        pl_hist = np.sum(pl_hists, axis=0).astype(int).tolist() if pl_hists else None
        pl_count = sum(sum(h) for h in pl_hists)
        pooled = (
            sum(
                c["pseudo_label_accuracy"] * sum(c["pseudo_label_histogram"])
                for c in clients
                if c["pseudo_label_accuracy"] is not None
                and len(c.get("pseudo_label_histogram", [])) == k
            )
            / pl_count
            if pl_count
            else None
        )
        record = {
            "round": server_round,
            "evaluated": acc is not None,  # false between evaluations (eval.every > 1)
            "test_accuracy": acc,
            "test_loss": loss,
            "val_accuracy": ev.get("val_accuracy"),
            "val_loss": ev.get("val_loss"),
            # the collapse signal and calibration of the global model on the test set
            "top_class_share": ev["top_class_share"],
            "prediction_entropy": ev["prediction_entropy"],
            "collapsed": ev["collapsed"],
            "predicted_histogram": ev["predicted_histogram"],
            "ece": ev["ece"],
            "mean_confidence": ev["mean_confidence"],
            "class_accuracy": None if cls_acc is None else [float(v) for v in cls_acc],
            "round_seconds": seconds,
            "lr": info.lr,
            "skipped": info.skipped,
            "sampled": len(info.sampled),  # clients the round asked to train
            "num_failures": len(info.failures),
            "failures": self.keep_tracebacks(server_round, info.failures),
            "clients": clients,
            "dma": info.dma,
            "robust": info.robust,  # norm bound and rule (strategy/robust.py)
            "strategy": info.strategy,  # strategy=<name>: which one, weights used
            "gradient_diversity": deferred(info.gradient_diversity),
            **method_notes(info.method),
            "js_divergence": float(np.mean(js_app)) if js_app else None,
            "js_divergence_labeled": float(np.mean(js_lab)) if js_lab else None,
            "pseudo_label_accuracy": float(np.mean(pl_acc)) if pl_acc else None,
            # classes of this round's confident pseudo-labels over all clients, and their
            # accuracy pooled over samples (clients weighted by their confident counts)
            "pseudo_label_histogram": pl_hist,
            "pseudo_label_accuracy_pooled": pooled,
            "pseudo_label_ratio": float(np.mean([c["pseudo_label_ratio"] for c in clients]))
            if clients
            else None,
            "class_accuracy_normalised": None if cls_acc is None else normalise(cls_acc).tolist(),
            "federated_evaluation": info.federated_evaluation,
            "timing": info.timing,  # seconds of the round's parts (server side)
        }
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps(_clean(record)) + "\n")
        self.history.append(record)
        self.tensorboard(record)
        self.tracking.log_round(record, self.resumed_from)
        done_here = server_round - (self.resumed_from or 0)  # rounds run by this process
        elapsed = time.perf_counter() - self.t_start
        eta = elapsed / done_here * (self.cfg["num_rounds"] - server_round)
        pl = record["pseudo_label_ratio"]
        val = record["val_accuracy"]
        scores = (
            f"test acc {acc:.4f}  "
            + (f"val acc {val:.4f}  " if val is not None else "")
            + f"loss {loss:.4f}  "
            if acc is not None
            else "(not evaluated: eval.every)  "
        )
        top = record["top_class_share"]
        print(
            f"[feddb] round {server_round:3d}/{self.cfg['num_rounds']}  {scores}"
            f"pl ratio {pl if pl is not None else 0:.2f}  "
            + (f"top class {top:.2f}  " if top is not None else "")
            + f"{seconds:.1f}s/round  eta {eta:.0f}s"
            + ("  SKIPPED" if record["skipped"] else ""),
            flush=True,
        )

    def keep_tracebacks(self, server_round: int, failures: list[dict]) -> list[dict]:
        """The round's failures for metrics.jsonl (one line each); the clients' tracebacks go
        whole into run_dir/client_errors.log."""
        traced = [f for f in failures if f.get("traceback")]
        if traced:
            with open(self.run_dir / "client_errors.log", "a") as f:
                for x in traced:
                    f.write(
                        f"round {server_round}, partition {x['partition_id']} (node "
                        f"{x['node_id']}): {x['reason']}\n{x['traceback'].rstrip()}\n\n"
                    )
        return [{k: v for k, v in x.items() if k != "traceback"} for x in failures]

    def state(self) -> dict[str, Any]:
        prev = self.prev_class_acc
        return {"prev_class_accuracy": None if prev is None else prev.tolist()}

    def restore(self, server_round: int, state: dict[str, Any]) -> None:
        """Continue after `server_round`: keep its metrics lines, drop any written after it."""
        lines = self.metrics_file.read_text().splitlines() if self.metrics_file.exists() else []
        records = [json.loads(line) for line in lines if line.strip()]
        kept = [r for r in records if r["round"] <= server_round]
        dropped = [r for r in records if r["round"] > server_round]
        if dropped:  # rounds after the checkpoint, run again now: their first records are kept
            with open(self.metrics_file.with_name("metrics.dropped.jsonl"), "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in dropped))
        self.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.history = kept
        prev = state.get("prev_class_accuracy")
        self.prev_class_acc = None if prev is None else np.asarray(prev)
        self.resumed_from = server_round

    def summary(self) -> dict[str, Any]:
        out = {
            **run_summary(self.history),
            "wall_seconds": time.perf_counter() - self.t_start,
            "run_dir": str(self.run_dir),
            "resumed_from_round": self.resumed_from,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2))
        self.tracking.finish(out)
        return out


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def run_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Headline figures of a run's rounds: final test accuracy, test accuracy at the round of best
    validation accuracy (model selection without the test set; the first such round on ties),
    best test accuracy over rounds (for reference only), and the collapse signal: the final
    model's, and the largest top-class share over all rounds and over the second half of them.
    Only the rounds evaluated count (all of them unless eval.every > 1; the last always is)."""
    rounds = len(history)
    acted = defence_rounds(history)
    # rounds that kept the global model (too few valid replies): the launchers' exit 4
    skipped = [r["round"] for r in history if r.get("skipped")]
    history = [r for r in history if r.get("test_accuracy") is not None]
    if not history:
        return {
            "final_test_accuracy": None,
            "rounds": rounds,
            "defence_rounds": acted,
            "skipped_rounds": skipped,
        }
    accs = [r["test_accuracy"] for r in history]
    best = int(np.argmax(accs))
    vals = [r.get("val_accuracy") for r in history]
    sel = (
        int(np.argmax([-1.0 if v is None else v for v in vals]))
        if any(v is not None for v in vals)
        else None
    )
    shares = [r["top_class_share"] for r in history if r.get("top_class_share") is not None]
    late = shares[len(shares) // 2 :]  # the second half: past the near-random first rounds
    return {
        "final_test_accuracy": accs[-1],
        "final_val_accuracy": vals[-1],
        "selected_round": history[sel]["round"] if sel is not None else None,
        "selected_test_accuracy": accs[sel] if sel is not None else None,
        "best_test_accuracy": accs[best],
        "best_round": history[best]["round"],
        "final_top_class_share": history[-1].get("top_class_share"),
        "max_top_class_share": max(shares) if shares else None,
        "max_top_class_share_late": max(late) if late else None,
        "collapsed": bool(history[-1].get("collapsed", False)),
        "final_worst_class_accuracy": worst_class(history[-1]),
        "selected_worst_class_accuracy": worst_class(history[sel]) if sel is not None else None,
        "selected_top_class_share": history[sel].get("top_class_share")
        if sel is not None
        else None,
        "defence_rounds": acted,
        "rounds": rounds,
        "skipped_rounds": skipped,
        "evaluated_rounds": len(accs),
    }


def worst_class(record: dict[str, Any]) -> float | None:
    acc = record.get("class_accuracy")
    return float(min(acc)) if acc else None


def defence_rounds(history: list[dict[str, Any]]) -> dict[str, int]:
    """Rounds in which each defence changed the aggregate: a run says whether its comparison
    measured the method or a defence (in a simulation with the defaults, all zero)."""
    counts = {"clipped": 0, "filtered": 0, "loss_checked_out": 0, "dma_cap_bound": 0}
    for r in history:
        rb, dma = r.get("robust") or {}, r.get("dma") or {}
        counts["clipped"] += bool(rb.get("clipped"))
        counts["filtered"] += bool(rb.get("dropped"))
        counts["loss_checked_out"] += bool(rb.get("loss_dropped"))
        counts["dma_cap_bound"] += bool(dma.get("at_cap"))
    return counts

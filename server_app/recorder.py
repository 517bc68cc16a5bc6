"""The run directory as the rounds go: metrics.jsonl (one fssl.record.RoundMetrics a round),
progress lines, summary.json; TensorBoard, and MLflow / W&B when configured (tracking.py). The
global model's scores come from server_app/evaluation.py."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord

from fssl.metrics import js_divergence, normalise
from fssl.record import RoundMetrics, Scores, parse_rounds, run_summary
from strategy import RoundRecord

from .evaluation import GlobalEvaluation
from .tracking import Tracking

# the method's server-side notes with a field of their own in every round's record
NOTE_KEYS = ("groups", "helpers")


def method_notes(notes: dict[str, Any]) -> dict[str, Any]:
    """What the method's server side noted this round (fssl.methods.base.MethodServer.notes):
    NOTE_KEYS in their fields, anything else under `method_notes`, where it cannot replace a
    field of the record."""
    rest = {k: v for k, v in notes.items() if k not in NOTE_KEYS}
    return {**{key: notes.get(key) for key in NOTE_KEYS}, "method_notes": rest or None}


def deferred(value: Any) -> Any:
    """A diagnostic the strategy left to compute when the round is recorded (off the critical
    path), or a value."""
    return value() if callable(value) else value


def mean_or_none(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def received_divergences(
    clients: list[dict[str, Any]], target: list[float] | None, k: int
) -> dict[str, float | None]:
    """JS divergence of the APP-U each client received (and of its labeled histogram) from the
    class-wise accuracy of the model it received (`target`), noted per client, mean over them."""
    js_app, js_lab = [], []
    for c in clients:
        if target is not None and len(c["app_u_global"]) == k:
            c["js_app_u"] = js_divergence(c["app_u_global"], np.asarray(target))
            js_app.append(c["js_app_u"])
        if target is not None and len(c["labeled_histogram"]) == k:
            c["js_labeled"] = js_divergence(c["labeled_histogram"], np.asarray(target))
            js_lab.append(c["js_labeled"])
    return {"js_divergence": mean_or_none(js_app), "js_divergence_labeled": mean_or_none(js_lab)}


def pseudo_label_figures(clients: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """The round's pseudo-labels over its clients: mean accuracy, the classes of the confident
    ones, their accuracy pooled over samples, and the mean share of unlabeled images labelled."""
    acc = [c["pseudo_label_accuracy"] for c in clients if c["pseudo_label_accuracy"] is not None]
    hists = [
        c["pseudo_label_histogram"]
        for c in clients
        if len(c.get("pseudo_label_histogram", [])) == k
    ]
    count = sum(sum(h) for h in hists)
    pooled = (
        sum(
            c["pseudo_label_accuracy"] * sum(c["pseudo_label_histogram"])
            for c in clients
            if c["pseudo_label_accuracy"] is not None
            and len(c.get("pseudo_label_histogram", [])) == k
        )
        / count
        if count
        else None
    )
    return {
        "pseudo_label_accuracy": mean_or_none(acc),
        "pseudo_label_histogram": np.sum(hists, axis=0).astype(int).tolist() if hists else None,
        "pseudo_label_accuracy_pooled": pooled,
        "pseudo_label_ratio": mean_or_none([c["pseudo_label_ratio"] for c in clients]),
    }


class RoundRecorder:
    """The round loop's `evaluate_fn` (server_app/rounds.py): scores the global model (on the
    rounds the evaluation says are due) and appends one record a round."""

    def __init__(self, cfg: dict[str, Any], evaluation: GlobalEvaluation, run_dir: Path) -> None:
        self.cfg, self.evaluation, self.run_dir = cfg, evaluation, run_dir
        self.num_classes = evaluation.ds.num_classes
        self.metrics_file = run_dir / "metrics.jsonl"
        self.prev_class_acc: list[float] | None = None
        self.resumed_from: int | None = None
        self.history: list[RoundMetrics] = []
        self.t_last = time.perf_counter()
        self.t_start = self.t_last
        self.write_seconds = 0.0
        self.tb = None  # TensorBoard writer, opened at the first round written
        self.tracking = Tracking(cfg, run_dir)  # MLflow, W&B: a run opened at the first round

    def tensorboard(self, record: RoundMetrics) -> None:
        """Scalars of one round in run_dir/tensorboard (`tensorboard --logdir runs/`)."""
        if not self.cfg["logging"]["tensorboard"]:
            return
        if self.tb is None:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run rewrites the rounds after its checkpoint: purge them from the events
            self.tb = SummaryWriter(
                str(self.run_dir / "tensorboard"),
                purge_step=record.round if self.resumed_from else None,
            )
        mean = lambda key: mean_or_none(  # noqa: E731
            [c[key] for c in record.clients if c.get(key) is not None]
        )
        dma, scores = record.dma or {}, record.scores
        scalars = {
            "test/accuracy": scores.test_accuracy,
            "test/loss": scores.test_loss,
            "train/loss_sup": mean("loss_sup"),
            "train/loss_unsup": mean("loss_unsup"),
            "pseudo_labels/accuracy": record.pseudo_label_accuracy,
            "pseudo_labels/ratio": record.pseudo_label_ratio,
            "val/accuracy": scores.val_accuracy,
            "collapse/top_class_share": scores.top_class_share,
            "collapse/prediction_entropy": scores.prediction_entropy,
            "calibration/ece": scores.ece,
            "bias/js_app_u": record.js_divergence,
            "bias/js_labeled": record.js_divergence_labeled,
            "aggregation/gradient_diversity": record.gradient_diversity,
            "aggregation/dma_loss_uniform": dma.get("loss_uniform"),
            "aggregation/dma_loss_weights": dma.get("loss_weights"),
            "aggregation/dma_weight_entropy": dma.get("weight_entropy"),
            "time/round_seconds": record.round_seconds,
            "failures": record.num_failures,
        }
        for tag, value in scalars.items():
            if value is not None and math.isfinite(value):
                self.tb.add_scalar(tag, value, record.round)
        self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        # a run stopped before its last round ends its tracked runs here; a complete one at
        # summary(), which the ServerApp calls after this
        last = self.history[-1].round if self.history else 0
        self.tracking.close(complete=last >= self.cfg["num_rounds"])

    def __call__(
        self, server_round: int, arrays: ArrayRecord, info: RoundRecord | None
    ) -> MetricRecord:
        """Score round t's global model and write its record (`info`: what the strategy did;
        None for the model a run starts from, round first_round - 1)."""
        t0 = time.perf_counter()
        due = self.evaluation.due(server_round)
        scores = self.evaluation.scores(arrays) if due else Scores()
        now = time.perf_counter()
        seconds, self.t_last = now - self.t_last, now  # the whole cycle since the last one
        if info is not None:
            info.timing.update({"evaluate": now - t0, "record_previous_round": self.write_seconds})
            self.write(self.record(server_round, scores, seconds, info))
        else:
            self.metrics_file.write_text("")
            print(f"[feddb] round   0  initial test acc {scores.test_accuracy:.4f}", flush=True)
        self.prev_class_acc = scores.class_accuracy  # None after a round not evaluated: no JS next
        self.write_seconds = time.perf_counter() - now  # metrics.jsonl, TensorBoard, the line
        acc, loss = scores.test_accuracy, scores.test_loss
        return MetricRecord({"test_accuracy": acc, "test_loss": loss} if acc is not None else {})

    def record(
        self, server_round: int, scores: Scores, seconds: float, info: RoundRecord
    ) -> RoundMetrics:
        """Round t's record: the scores, what the strategy did, and what the clients' replies
        say against the model they received (the previous round's class-wise accuracy)."""
        k, cls_acc = self.num_classes, scores.class_accuracy
        return RoundMetrics(
            round=server_round,
            scores=scores,
            round_seconds=seconds,
            lr=info.lr,
            skipped=info.skipped,
            sampled=len(info.sampled),
            num_failures=len(info.failures),
            failures=self.keep_tracebacks(server_round, info.failures),
            clients=info.clients,
            dma=info.dma,
            robust=info.robust,
            strategy=info.strategy,
            gradient_diversity=deferred(info.gradient_diversity),
            **method_notes(info.method),
            **received_divergences(info.clients, self.prev_class_acc, k),
            **pseudo_label_figures(info.clients, k),
            class_accuracy_normalised=None if cls_acc is None else normalise(cls_acc).tolist(),
            federated_evaluation=info.federated_evaluation,
            timing=info.timing,
        )

    def write(self, record: RoundMetrics) -> None:
        """The record to metrics.jsonl, TensorBoard and the trackers; its progress line."""
        with open(self.metrics_file, "a") as f:
            f.write(record.to_json() + "\n")
        self.history.append(record)
        self.tensorboard(record)
        self.tracking.log_round(record, self.resumed_from)
        print(self.progress_line(record), flush=True)

    def progress_line(self, record: RoundMetrics) -> str:
        """`round t/T  test acc ...  pl ratio ...  s/round  eta`."""
        done_here = record.round - (self.resumed_from or 0)  # rounds run by this process
        elapsed = time.perf_counter() - self.t_start
        eta = elapsed / done_here * (self.cfg["num_rounds"] - record.round)
        s, pl = record.scores, record.pseudo_label_ratio
        scores = (
            f"test acc {s.test_accuracy:.4f}  "
            + (f"val acc {s.val_accuracy:.4f}  " if s.val_accuracy is not None else "")
            + f"loss {s.test_loss:.4f}  "
            if record.evaluated
            else "(not evaluated: eval.every)  "
        )
        top = s.top_class_share
        return (
            f"[feddb] round {record.round:3d}/{self.cfg['num_rounds']}  {scores}"
            f"pl ratio {pl if pl is not None else 0:.2f}  "
            + (f"top class {top:.2f}  " if top is not None else "")
            + f"{record.round_seconds:.1f}s/round  eta {eta:.0f}s"
            + ("  SKIPPED" if record.skipped else "")
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
        return {"prev_class_accuracy": self.prev_class_acc}

    def restore(self, server_round: int, state: dict[str, Any]) -> None:
        """Continue after `server_round`: keep its metrics lines, drop any written after it."""
        text = self.metrics_file.read_text() if self.metrics_file.exists() else ""
        records = parse_rounds(text)
        kept = [r for r in records if r.round <= server_round]
        dropped = [r for r in records if r.round > server_round]
        if dropped:  # rounds after the checkpoint, run again now: their first records are kept
            with open(self.metrics_file.with_name("metrics.dropped.jsonl"), "a") as f:
                f.write("".join(r.to_json() + "\n" for r in dropped))
        self.metrics_file.write_text("".join(r.to_json() + "\n" for r in kept))
        self.history = kept
        self.prev_class_acc = state.get("prev_class_accuracy")
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

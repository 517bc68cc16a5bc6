"""Central evaluation every round and the run directory: metrics.jsonl, progress lines, summary."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord

from fssl.data import Dataset
from fssl.metrics import class_accuracy, js_divergence, normalise
from fssl.train import evaluate, to_nchw
from strategy.base import WeightedAverage


class RoundRecorder:
    """`evaluate_fn` of Strategy.start: evaluates the global model and appends one JSON line."""

    def __init__(self, cfg: dict[str, Any], ds: Dataset, model: torch.nn.Module,
                 strategy: WeightedAverage, run_dir: Path, device: torch.device) -> None:
        self.cfg, self.ds, self.model, self.strategy = cfg, ds, model.to(device), strategy
        self.run_dir, self.device = run_dir, device
        self.x_test = to_nchw(ds.x_test, device)
        self.y_test = torch.from_numpy(ds.y_test).to(device)
        self.metrics_file = run_dir / "metrics.jsonl"
        self.prev_class_acc: np.ndarray | None = None
        self.resumed_from: int | None = None
        self.history: list[dict[str, Any]] = []
        self.t_last = time.perf_counter()
        self.t_start = self.t_last
        self.tb = None                     # TensorBoard writer, opened at the first round written

    def tensorboard(self, record: dict[str, Any]) -> None:
        """Scalars of one round in run_dir/tensorboard (`tensorboard --logdir runs/`)."""
        if not self.cfg["logging"]["tensorboard"]:
            return
        if self.tb is None:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run rewrites the rounds after its checkpoint: purge them from the events
            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"),
                                    purge_step=record["round"] if self.resumed_from else None)
        clients = record["clients"]
        mean = lambda key: (float(np.mean([c[key] for c in clients if c.get(key) is not None]))  # noqa: E731
                            if any(c.get(key) is not None for c in clients) else None)
        dma = record.get("dma") or {}
        scalars = {
            "test/accuracy": record["test_accuracy"], "test/loss": record["test_loss"],
            "train/loss_sup": mean("loss_sup"), "train/loss_unsup": mean("loss_unsup"),
            "pseudo_labels/accuracy": record["pseudo_label_accuracy"],
            "pseudo_labels/ratio": record["pseudo_label_ratio"],
            "bias/js_app_u": record["js_divergence"],
            "bias/js_labeled": record["js_divergence_labeled"],
            "aggregation/gradient_diversity": record["gradient_diversity"],
            "aggregation/dma_loss_uniform": dma.get("loss_uniform"),
            "aggregation/dma_loss_weights": dma.get("loss_weights"),
            "aggregation/dma_weight_entropy": dma.get("weight_entropy"),
            "time/round_seconds": record["round_seconds"], "failures": record["num_failures"],
        }
        for tag, value in scalars.items():
            if value is not None and math.isfinite(value):
                self.tb.add_scalar(tag, value, record["round"])
        self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()

    def evaluate(self, arrays: ArrayRecord) -> tuple[float, float, np.ndarray]:
        self.model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc, pred = evaluate(self.model, self.x_test, self.y_test, self.ds.mean,
                                   self.ds.std, self.cfg["eval"]["batch_size"])
        return loss, acc, class_accuracy(pred, self.ds.y_test, self.ds.num_classes)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        loss, acc, cls_acc = self.evaluate(arrays)
        now = time.perf_counter()
        if server_round > 0:
            self.write(server_round, loss, acc, cls_acc, now - self.t_last)
        else:
            self.metrics_file.write_text("")
            print(f"[feddb] round   0  initial test acc {acc:.4f}", flush=True)
        self.prev_class_acc = cls_acc
        self.t_last = time.perf_counter()
        return MetricRecord({"test_accuracy": acc, "test_loss": loss})

    def write(self, server_round: int, loss: float, acc: float, cls_acc: np.ndarray,
              seconds: float) -> None:
        info = self.strategy.last_round
        clients = info.get("clients", [])
        target = self.prev_class_acc       # class-wise accuracy of the model the clients received
        js_app, js_lab = [], []
        k = self.ds.num_classes
        for c in clients:
            if target is not None and len(c["app_u_global"]) == k:
                c["js_app_u"] = js_divergence(c["app_u_global"], target)
                js_app.append(c["js_app_u"])
            if target is not None and len(c["labeled_histogram"]) == k:
                c["js_labeled"] = js_divergence(c["labeled_histogram"], target)
                js_lab.append(c["js_labeled"])
        pl_acc = [c["pseudo_label_accuracy"] for c in clients
                  if c["pseudo_label_accuracy"] is not None]
        record = {
            "round": server_round,
            "test_accuracy": acc,
            "test_loss": loss,
            "class_accuracy": [float(v) for v in cls_acc],
            "round_seconds": seconds,
            "lr": self.strategy.lr_for(server_round),
            "skipped": bool(info.get("skipped", False)),
            "num_failures": len(info.get("failures", [])),
            "failures": info.get("failures", []),
            "clients": clients,
            "dma": info.get("dma"),
            "gradient_diversity": info.get("gradient_diversity"),
            "groups": info.get("groups"),          # FedRGD: partition ids per group
            "helpers": info.get("helpers"),        # FedMatch: helper partition ids per client
            "js_divergence": float(np.mean(js_app)) if js_app else None,
            "js_divergence_labeled": float(np.mean(js_lab)) if js_lab else None,
            "pseudo_label_accuracy": float(np.mean(pl_acc)) if pl_acc else None,
            "pseudo_label_ratio": float(np.mean([c["pseudo_label_ratio"] for c in clients]))
            if clients else None,
            "class_accuracy_normalised": normalise(cls_acc).tolist(),
            "federated_evaluation": info.get("federated_evaluation"),
        }
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps(_clean(record)) + "\n")
        self.history.append(record)
        self.tensorboard(record)
        done_here = server_round - (self.resumed_from or 0)      # rounds run by this process
        elapsed = time.perf_counter() - self.t_start
        eta = elapsed / done_here * (self.cfg["num_rounds"] - server_round)
        pl = record["pseudo_label_ratio"]
        print(f"[feddb] round {server_round:3d}/{self.cfg['num_rounds']}  test acc {acc:.4f}  "
              f"loss {loss:.4f}  pl ratio {pl if pl is not None else 0:.2f}  "
              f"{seconds:.1f}s/round  eta {eta:.0f}s"
              + ("  SKIPPED" if record["skipped"] else ""), flush=True)

    def state(self) -> dict[str, Any]:
        prev = self.prev_class_acc
        return {"prev_class_accuracy": None if prev is None else prev.tolist()}

    def restore(self, server_round: int, state: dict[str, Any]) -> None:
        """Continue after `server_round`: keep its metrics lines, drop any written after it."""
        lines = self.metrics_file.read_text().splitlines() if self.metrics_file.exists() else []
        kept = [json.loads(line) for line in lines if line.strip()]
        kept = [r for r in kept if r["round"] <= server_round]
        self.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.history = kept
        prev = state.get("prev_class_accuracy")
        self.prev_class_acc = None if prev is None else np.asarray(prev)
        self.resumed_from = server_round

    def summary(self) -> dict[str, Any]:
        accs = [r["test_accuracy"] for r in self.history]
        best = int(np.argmax(accs)) if accs else -1
        out = {
            "best_test_accuracy": accs[best] if accs else None,
            "best_round": self.history[best]["round"] if accs else None,
            "final_test_accuracy": accs[-1] if accs else None,
            "rounds": len(accs),
            "wall_seconds": time.perf_counter() - self.t_start,
            "run_dir": str(self.run_dir),
            "resumed_from_round": self.resumed_from,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2))
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

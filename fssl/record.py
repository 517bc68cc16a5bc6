"""A run's record: one `RoundMetrics` a round (a line of metrics.jsonl), the scores of the global
model inside it, and the run's headline figures (summary.json). The ServerApp's recorder writes
it; tracking, `feddb report`, `feddb claims` and the studies read it back. Older files (and the
trimmed ones in docs/*/runs.tar.xz) lack some fields: they read as their defaults."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Scores:
    """The central evaluation of one global model (server_app/evaluation.py) on the test set,
    and on the validation split when the dataset holds one. All None: a round not evaluated
    (eval.every > 1)."""

    test_accuracy: float | None = None
    test_loss: float | None = None
    val_accuracy: float | None = None
    val_loss: float | None = None
    # the collapse signal and calibration of the model on the test set (fssl.metrics)
    top_class_share: float | None = None
    prediction_entropy: float | None = None
    collapsed: bool | None = None
    predicted_histogram: list[int] | None = None
    ece: float | None = None
    mean_confidence: float | None = None
    class_accuracy: list[float] | None = None


@dataclass
class RoundMetrics:
    """One round of a run as metrics.jsonl holds it: the global model's scores, what the strategy
    did (strategy.RoundRecord), and what the recorder derived from the clients' replies."""

    round: int
    scores: Scores = field(default_factory=Scores)
    round_seconds: float | None = None  # the whole cycle since the previous record
    lr: float | None = None
    skipped: bool = False  # too few valid replies: the global model was kept
    sampled: int | None = None  # clients the round asked to train
    num_failures: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)  # tracebacks left out
    clients: list[dict[str, Any]] = field(default_factory=list)  # strategy/contract.py's entries
    dma: dict[str, Any] | None = None
    robust: dict[str, Any] | None = None  # norm bound and rule (strategy/robust.py)
    strategy: dict[str, Any] | None = None  # strategy=<name>: which one, weights used
    gradient_diversity: float | None = None
    # the method's server-side notes every record carries (fssl.methods.base.MethodServer.notes):
    # the groups it averaged by, the helpers it sent each client; any other note goes under
    # method_notes, which only a record with such notes has
    groups: Any = None
    helpers: Any = None
    method_notes: dict[str, Any] | None = None
    # the APP-U each client received and its labeled histogram against the class-wise accuracy
    # of the model it received (the paper's Figure 3), mean over the clients
    js_divergence: float | None = None
    js_divergence_labeled: float | None = None
    pseudo_label_accuracy: float | None = None  # mean over the clients
    # classes of this round's confident pseudo-labels over all clients, and their accuracy
    # pooled over samples (clients weighted by their confident counts)
    pseudo_label_histogram: list[int] | None = None
    pseudo_label_accuracy_pooled: float | None = None
    pseudo_label_ratio: float | None = None
    class_accuracy_normalised: list[float] | None = None
    federated_evaluation: dict[str, Any] | None = None
    timing: dict[str, float] = field(default_factory=dict)  # seconds of the round's server parts

    @property
    def evaluated(self) -> bool:
        """False between evaluations (eval.every > 1)."""
        return self.scores.test_accuracy is not None

    def to_dict(self) -> dict[str, Any]:
        """The line's fields in their order, the scores at the top level; NaN and inf as null."""
        out: dict[str, Any] = {"round": self.round, "evaluated": self.evaluated}
        out |= asdict(self.scores)
        for f in own_fields(type(self)):
            out[f.name] = getattr(self, f.name)
        if self.method_notes is None:
            del out["method_notes"]
        return finite(out)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, line: dict[str, Any]) -> RoundMetrics:
        """A parsed line; fields it lacks take their defaults, keys no field has are left out."""
        scores = Scores(**{f.name: line[f.name] for f in fields(Scores) if f.name in line})
        own = {f.name: line[f.name] for f in own_fields(cls) if f.name in line}
        return cls(round=line["round"], scores=scores, **own)

    @classmethod
    def from_json(cls, line: str) -> RoundMetrics:
        return cls.from_dict(json.loads(line))


def own_fields(cls: type) -> list:
    """RoundMetrics' fields after `round` and `scores`, in the line's order."""
    return [f for f in fields(cls) if f.name not in ("round", "scores")]


def finite(obj: Any) -> Any:
    """JSON-safe: NaN and inf become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def parse_rounds(text: str) -> list[RoundMetrics]:
    """The records of a metrics.jsonl file's text."""
    return [RoundMetrics.from_json(line) for line in text.splitlines() if line.strip()]


def read_rounds(run_dir: Path) -> list[RoundMetrics]:
    return parse_rounds((run_dir / "metrics.jsonl").read_text())


def run_summary(history: list[RoundMetrics]) -> dict[str, Any]:
    """Headline figures of a run's rounds: final test accuracy, test accuracy at the round of best
    validation accuracy (model selection without the test set; the first such round on ties),
    best test accuracy over rounds (for reference only), and the collapse signal: the final
    model's, and the largest top-class share over all rounds and over the second half of them.
    Only the rounds evaluated count (all of them unless eval.every > 1; the last always is)."""
    rounds = len(history)
    acted = defence_rounds(history)
    # rounds that kept the global model (too few valid replies): the launchers' exit 4
    skipped = [r.round for r in history if r.skipped]
    scored = [(r.round, r.scores) for r in history if r.evaluated]
    if not scored:
        return {
            "final_test_accuracy": None,
            "rounds": rounds,
            "defence_rounds": acted,
            "skipped_rounds": skipped,
        }
    accs = [s.test_accuracy for _, s in scored]
    best = int(np.argmax(accs))
    vals = [s.val_accuracy for _, s in scored]
    sel = (
        int(np.argmax([-1.0 if v is None else v for v in vals]))
        if any(v is not None for v in vals)
        else None
    )
    shares = [s.top_class_share for _, s in scored if s.top_class_share is not None]
    late = shares[len(shares) // 2 :]  # the second half: past the near-random first rounds
    final = scored[-1][1]
    chosen = scored[sel][1] if sel is not None else None
    return {
        "final_test_accuracy": accs[-1],
        "final_val_accuracy": vals[-1],
        "selected_round": scored[sel][0] if sel is not None else None,
        "selected_test_accuracy": accs[sel] if sel is not None else None,
        "best_test_accuracy": accs[best],
        "best_round": scored[best][0],
        "final_top_class_share": final.top_class_share,
        "max_top_class_share": max(shares) if shares else None,
        "max_top_class_share_late": max(late) if late else None,
        "collapsed": bool(final.collapsed),
        "final_worst_class_accuracy": worst_class(final),
        "selected_worst_class_accuracy": worst_class(chosen) if chosen is not None else None,
        "selected_top_class_share": chosen.top_class_share if chosen is not None else None,
        "defence_rounds": acted,
        "rounds": rounds,
        "skipped_rounds": skipped,
        "evaluated_rounds": len(accs),
    }


def worst_class(scores: Scores) -> float | None:
    return float(min(scores.class_accuracy)) if scores.class_accuracy else None


def defence_rounds(history: list[RoundMetrics]) -> dict[str, int]:
    """Rounds in which each defence changed the aggregate: a run says whether its comparison
    measured the method or a defence (in a simulation with the defaults, all zero)."""
    counts = {"clipped": 0, "filtered": 0, "loss_checked_out": 0, "dma_cap_bound": 0}
    for r in history:
        rb, dma = r.robust or {}, r.dma or {}
        counts["clipped"] += bool(rb.get("clipped"))
        counts["filtered"] += bool(rb.get("dropped"))
        counts["loss_checked_out"] += bool(rb.get("loss_dropped"))
        counts["dma_cap_bound"] += bool(dma.get("at_cap"))
    return counts

"""The paper's partition (section 5.1): a class-balanced labeled split, the rest unlabeled, each pool
spread over M clients (IID or Dirichlet(delta) per class, independent draws), and each client's own
labeled images added, labels removed, to its unlabeled set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_REDRAWS = 1000


@dataclass
class Partition:
    labeled: list[np.ndarray]  # per client: indices into the train set
    unlabeled: list[np.ndarray]  # per client: indices into the train set (own labeled included)
    num_classes: int

    @property
    def num_clients(self) -> int:
        return len(self.labeled)

    def histograms(self, y: np.ndarray) -> dict[str, list[list[int]]]:
        k = self.num_classes
        return {
            "labeled": [np.bincount(y[i], minlength=k).tolist() for i in self.labeled],
            "unlabeled": [np.bincount(y[i], minlength=k).tolist() for i in self.unlabeled],
        }

    def to_json(self) -> dict:
        return {
            "num_classes": self.num_classes,
            "labeled": [i.tolist() for i in self.labeled],
            "unlabeled": [i.tolist() for i in self.unlabeled],
        }


def balanced_labeled_split(
    y: np.ndarray, num_labeled: int, num_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """`num_labeled // K` random samples per class as labeled; everything else unlabeled."""
    per_class = num_labeled // num_classes
    if per_class < 1:
        raise ValueError(
            f"dataset.num_labeled={num_labeled} gives no labeled sample per class "
            f"for {num_classes} classes; use at least {num_classes}"
        )
    chosen = []
    for c in range(num_classes):
        idx = np.flatnonzero(y == c)
        if len(idx) < per_class:
            raise ValueError(
                f"class {c} has {len(idx)} samples, fewer than the {per_class} "
                f"labeled per class that dataset.num_labeled={num_labeled} asks"
            )
        chosen.append(rng.choice(idx, per_class, replace=False))
    labeled = np.sort(np.concatenate(chosen))
    unlabeled = np.setdiff1d(np.arange(len(y)), labeled)
    return labeled, unlabeled


def spread(
    idx: np.ndarray,
    y: np.ndarray,
    num_clients: int,
    mode: str,
    delta: float | None,
    num_classes: int,
    rng: np.random.Generator,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Spread the pool `idx` over clients. IID: equal random shares (remainder spread one each).
    Dirichlet: per class, proportions ~ Dir(delta * 1_M), clients already over N/M capped at 0
    (the partitioner of SemiFL/FedDB), redrawn until every client holds `min_size` samples."""
    if len(idx) < num_clients * min_size:
        raise ValueError(
            f"cannot give {num_clients} clients {min_size} sample(s) each from a "
            f"pool of {len(idx)}; use fewer clients or more data"
        )
    if mode == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(idx), num_clients)]
    cap = len(idx) / num_clients
    for _ in range(MAX_REDRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients)
        for c in range(num_classes):
            members = rng.permutation(idx[y[idx] == c])
            p = rng.dirichlet(np.full(num_clients, float(delta)))
            p = p * (sizes < cap)
            p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(p) * len(members)).astype(int)[:-1]
            for m, chunk in enumerate(np.split(members, cuts)):
                parts[m].append(chunk)
                sizes[m] += len(chunk)
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    raise ValueError(
        f"Dirichlet(delta={delta}) could not give every one of {num_clients} "
        f"clients {min_size} sample(s) in {MAX_REDRAWS} draws; raise delta or "
        "lower partition.min_size"
    )


def long_tailed(
    pool: np.ndarray, y: np.ndarray, num_classes: int, ratio: float, rng: np.random.Generator
) -> np.ndarray:
    """A random subset of `pool` whose class counts fall exponentially from class 0 to class K-1,
    n_c = n_max * ratio^(-c / (K - 1)) (the CIFAR-LT profile), n_max the smallest class's size in
    the pool, so the largest class over the smallest is `ratio` (to rounding)."""
    members = [pool[y[pool] == c] for c in range(num_classes)]
    n_max = min(len(m) for m in members)
    keep = [
        rng.choice(m, max(1, round(n_max * ratio ** (-c / max(num_classes - 1, 1)))), replace=False)
        for c, m in enumerate(members)
    ]
    return np.sort(np.concatenate(keep))


def make_partition(
    y: np.ndarray,
    num_classes: int,
    num_labeled: int,
    num_clients: int,
    mode: str,
    delta: float | None,
    seed: int,
    min_size: int = 1,
    imbalance_ratio: float | None = None,
) -> Partition:
    """`imbalance_ratio`: the unlabeled pool is long-tailed (long_tailed) before it is spread;
    the labeled set and the test set stay balanced. Images left out are used by no client."""
    rng = np.random.default_rng([seed, 2024])
    labeled_pool, unlabeled_pool = balanced_labeled_split(y, num_labeled, num_classes, rng)
    if imbalance_ratio is not None:
        unlabeled_pool = long_tailed(unlabeled_pool, y, num_classes, imbalance_ratio, rng)
    labeled = spread(labeled_pool, y, num_clients, mode, delta, num_classes, rng, min_size)
    unlabeled = spread(unlabeled_pool, y, num_clients, mode, delta, num_classes, rng, min_size)
    unlabeled = [np.sort(np.concatenate([u, l])) for u, l in zip(unlabeled, labeled)]
    return Partition(labeled, unlabeled, num_classes)


def partition_from_cfg(cfg: dict, y: np.ndarray, num_classes: int) -> Partition:
    p = cfg["partition"]
    return make_partition(
        y,
        num_classes,
        cfg["dataset"]["num_labeled"],
        cfg["fl"]["num_clients"],
        p["mode"],
        p["delta"],
        cfg["seed"],
        p["min_size"],
        p.get("imbalance_ratio"),
    )


def summary_table(part: Partition, y: np.ndarray) -> str:
    """Per-client class histograms of labeled and unlabeled data as a text table."""
    hist = part.histograms(y)
    k = part.num_classes
    head = f"{'client':>6} {'n_lab':>6} {'n_unl':>6} | labeled per class | unlabeled per class"
    lines = [head, "-" * len(head)]
    for m in range(part.num_clients):
        lab, unl = hist["labeled"][m], hist["unlabeled"][m]
        if k <= 20:
            lab_s, unl_s = " ".join(map(str, lab)), " ".join(map(str, unl))
        else:
            lab_s = f"{sum(1 for v in lab if v)} classes present"
            unl_s = f"{sum(1 for v in unl if v)} classes present"
        lines.append(f"{m:>6} {sum(lab):>6} {sum(unl):>6} | {lab_s} | {unl_s}")
    return "\n".join(lines) + "\n"


def save_partition(part: Partition, y: np.ndarray, run_dir: Path) -> None:
    (run_dir / "partition.json").write_text(json.dumps(part.to_json()))
    hist = part.histograms(y)
    summary = {
        "num_clients": part.num_clients,
        "num_classes": part.num_classes,
        "num_labeled": [len(i) for i in part.labeled],
        "num_unlabeled": [len(i) for i in part.unlabeled],
        **hist,
    }
    (run_dir / "partition_summary.json").write_text(json.dumps(summary))
    (run_dir / "partition_summary.txt").write_text(summary_table(part, y))

"""Evaluation metrics: class-wise accuracy, Jensen-Shannon divergence, entropy."""

from __future__ import annotations

import numpy as np


def class_accuracy(pred: np.ndarray, target: np.ndarray, num_classes: int) -> np.ndarray:
    correct = np.bincount(target[pred == target], minlength=num_classes)
    total = np.bincount(target, minlength=num_classes)
    return correct / np.maximum(total, 1)


def normalise(v: np.ndarray) -> np.ndarray:
    v = np.clip(np.asarray(v, dtype=np.float64), 0, None)
    s = v.sum()
    return v / s if s > 0 else np.full(len(v), 1.0 / len(v))


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence in bits (0 for equal, 1 for disjoint); inputs are normalised."""
    p, q = normalise(p), normalise(q)
    m = 0.5 * (p + q)

    def kl(a: np.ndarray, b: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / b[nz])))

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def entropy(w: np.ndarray) -> float:
    """Shannon entropy in nats (log M for uniform weights over M clients)."""
    w = np.asarray(w, dtype=np.float64)
    nz = w > 0
    return float(-np.sum(w[nz] * np.log(w[nz])))

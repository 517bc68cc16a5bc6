"""Evaluation metrics: class-wise accuracy, Jensen-Shannon divergence, entropy, the collapse signal
and calibration."""

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


COLLAPSE_SHARE = 0.5  # a model predicting one class for more than half of a balanced test set


def prediction_stats(
    pred: np.ndarray, conf: np.ndarray, target: np.ndarray, num_classes: int, bins: int = 15
) -> dict:
    """The collapse signal and calibration of one model's test predictions: the predicted-class
    histogram, the share of the most-predicted class, the histogram's entropy in bits (log2 K when
    every class is predicted equally often, 0 for one class), and the expected calibration error
    (|accuracy - confidence| over `bins` equal-width confidence bins, weighted by their counts)."""
    hist = np.bincount(pred, minlength=num_classes)
    share = hist / max(len(pred), 1)
    nz = share[share > 0]
    edges = np.minimum((conf * bins).astype(int), bins - 1)
    correct = (pred == target).astype(np.float64)
    ece = sum(
        abs(correct[edges == b].mean() - conf[edges == b].mean()) * (edges == b).sum()
        for b in range(bins)
        if (edges == b).any()
    ) / max(len(pred), 1)
    return {
        "predicted_histogram": hist.tolist(),
        "top_class_share": float(share.max()),
        "prediction_entropy": abs(float((nz * np.log2(nz)).sum())),
        "ece": float(ece),
        "mean_confidence": float(conf.mean()) if len(conf) else 0.0,
        "collapsed": bool(share.max() > COLLAPSE_SHARE),
    }

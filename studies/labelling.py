"""Which pseudo-labels DPL corrects (`feddb claims`, secondary to a regime's verdicts).

From the clients' records in metrics.jsonl (fssl.methods.base.LocalTrainer.label_stats): per true
class, the pseudo-labels that weigh in the loss, how many of those are right, and per class of
pseudo-label how many there are. Pooled over the seeds every arm of a cell has, its clients and
semi-supervised rounds, they give each class's precision (right / labelled that class) and
accuracy on its kept images (right / the class's images whose pseudo-label weighs in the loss).
Per client, DPL's paired effect on pseudo-label accuracy (the same seed, so the same partition and
warm-up), grouped by how skewed the client's unlabeled pool is (its largest class's share,
partition_summary.json): which clients' labels it corrects; the clients of a run share its model,
so the sign test counts seeds (each seed's mean over a bin's clients), not clients."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from feddb.stats import p_text, paired_test

FIELDS = ("pseudo_label_histogram", "pseudo_label_class_true", "pseudo_label_class_correct")
# (arm, baseline) pairs whose paired effect is shown; a name stands for the run without DMA under
# the regime's own weighting too
EFFECTS = (("FixMatch-FedDPL", "FixMatch"), ("FixMatch-FedDPL (global prior)", "FixMatch"))
SKEW_BINS = ((0.0, 0.5), (0.5, 0.8), (0.8, 1.01))  # the client's largest unlabeled class share


def semi_clients(run: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(round, client record) of every client record after the labels-only warm-up."""
    warm = run["cfg"]["train"]["warmup_rounds"]
    return [(r.round, c) for r in run["rounds"] if r.round > warm for c in r.clients]


def recorded(run: dict[str, Any]) -> bool:
    """Whether the run's clients recorded their pseudo-labels by true class."""
    return any(c.get(FIELDS[1]) for _, c in semi_clients(run))


def by_class(runs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Each of FIELDS summed over the runs' semi-supervised client records."""
    sums = {f: 0 for f in FIELDS}
    for run in runs:
        for _, c in semi_clients(run):
            if all(c.get(f) for f in FIELDS):
                for f in FIELDS:
                    sums[f] = sums[f] + np.asarray(c[f], dtype=np.int64)
    return sums


def ratio(num: np.ndarray, den: np.ndarray) -> list[str]:
    return [f"{100 * n / d:.1f}" if d else "–" for n, d in zip(num, den)]


def class_table(arms: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Per class, each arm's precision and accuracy on the class's images, %."""
    sums = {name: by_class(runs) for name, runs in arms.items()}
    sums = {n: s for n, s in sums.items() if not isinstance(s[FIELDS[0]], int)}
    if not sums:
        return []
    head = " | ".join(f"{n}: precision | {n}: right on its kept images" for n in sums)
    out = [f"| class | {head} |", "|---" * (2 * len(sums) + 1) + "|"]
    cols = []
    for s in sums.values():
        hist, true, right = (s[f] for f in FIELDS)
        cols += [ratio(right, hist), ratio(right, true)]
    for k, row in enumerate(zip(*cols)):
        out.append(f"| {k} | " + " | ".join(row) + " |")
    return out


def client_accuracy(run: dict[str, Any]) -> dict[int, float]:
    """Each client's pseudo-label accuracy, the mean over its semi-supervised rounds."""
    acc: dict[int, list[float]] = defaultdict(list)
    for _, c in semi_clients(run):
        if c.get("pseudo_label_accuracy") is not None:
            acc[c["partition_id"]].append(c["pseudo_label_accuracy"])
    return {pid: float(np.mean(v)) for pid, v in acc.items()}


def skews(run_dir: Path) -> list[float]:
    """Each client's largest class's share of its unlabeled pool."""
    pools = json.loads((Path(run_dir) / "partition_summary.json").read_text())["unlabeled"]
    return [max(h) / max(sum(h), 1) for h in pools]


def client_effect(arm: dict[int, dict], base: dict[int, dict], seeds: list[int]) -> list[str]:
    """Per bin of client skew: the paired per-client differences of pseudo-label accuracy (arm −
    base, points) over the seeds' clients, their mean and how many rose and fell (descriptive:
    the clients of one run share its global model, so they are not independent samples), and per
    seed the mean over the bin's clients, the unit the sign test counts."""
    diffs: dict[tuple[float, float], dict[int, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for s in seeds:
        a, b, skew = client_accuracy(arm[s]), client_accuracy(base[s]), skews(arm[s]["dir"])
        for pid in sorted(a.keys() & b.keys()):
            at = next(x for x in SKEW_BINS if x[0] <= skew[pid] < x[1])
            diffs[at][s].append(100 * (a[pid] - b[pid]))
    out = []
    for lo, hi in SKEW_BINS:
        per_seed = diffs.get((lo, hi), {})
        d = [x for v in per_seed.values() for x in v]
        if d:
            test = paired_test([float(np.mean(v)) for v in per_seed.values()])
            up, down = test["signs"]
            out.append(
                f"| {lo:.1f}–{min(hi, 1):.1f} | {len(d)} | {np.mean(d):+.2f} | "
                f"{sum(x > 0 for x in d)} / {sum(x < 0 for x in d)} | {up} / {down} "
                f"(sign test p {p_text(test['p_sign'])}) |"
            )
    return out


def markdown(cell: list[dict[str, Any]], pairable) -> list[str]:
    """The cell's pseudo-label tables (empty where its runs did not record them). `pairable`:
    fssl.pairing's rule."""
    arms: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in cell:
        if recorded(r):
            arms[r["variant"]][r["seed"]] = r
    if not arms:
        return []
    common = sorted(set.intersection(*(set(runs) for runs in arms.values())))
    out = []
    if common:  # every arm over the same seeds, so that the columns compare
        out += [
            "Pseudo-labels by class, pooled over the seeds every arm has "
            f"({', '.join(map(str, common))}), clients and semi-supervised rounds, %; precision: "
            "right / labelled that class; right on its kept images: right / the class's images "
            "whose pseudo-label weighed in the loss:",
            "",
            *class_table({n: [runs[s] for s in common] for n, runs in arms.items()}),
            "",
        ]
    for a, b in effects(list(arms)):
        seeds = [s for s in sorted(arms[a].keys() & arms[b].keys())]
        seeds = [s for s in seeds if pairable(arms[a][s], arms[b][s]) is None]
        rows = client_effect(arms[a], arms[b], seeds)
        if rows:
            out += [
                f"{a} − {b}, each client's pseudo-label accuracy (mean over its semi-supervised "
                f"rounds), paired per seed ({len(seeds)} seed{'s' * (len(seeds) != 1)}), by the client's largest "
                "unlabeled class share; clients: descriptive (one run's clients share its model); "
                "seeds: the mean over the bin's clients of each seed, with the sign test:",
                "",
                "| largest class share | clients | mean difference, points | clients rose / fell "
                "| seeds rose / fell |",
                "|---|---|---|---|---|",
                *rows,
                "",
            ]
    return out


def effects(variants: list[str]) -> list[tuple[str, str]]:
    """The (arm, baseline) pairs of EFFECTS among a cell's variants, under one weighting."""
    out = []
    for a, b in EFFECTS:
        for va in variants:
            for vb in variants:
                if va.startswith(a) and vb.startswith(b) and va[len(a) :] == vb[len(b) :]:
                    out.append((va, vb))
    return out

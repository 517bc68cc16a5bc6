"""The statistics every table of runs uses, stated once: paired differences over seeds (mean, 95 %
Student-t interval, t-test, and the exact sign test beside it, which assumes nothing of a bimodal
outcome), collapse counted as a yes/no outcome (Fisher's exact test), and Holm's step-down
correction over a family of comparisons."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def interval95(diffs: list[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95 % Student-t interval of paired differences (NaN bounds for n < 2)."""
    from scipy import stats

    a = np.asarray(diffs, dtype=float)
    m = float(a.mean())
    if len(a) < 2:
        return m, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))
    return m, m - half, m + half


def sign_test(above: int, below: int) -> float:
    """Exact two-sided sign test of paired differences: `above` seeds > 0 and `below` < 0 (ties
    carry no sign and are dropped). With 5 seeds its smallest p-value is 2 / 32 = 0.0625."""
    from scipy import stats

    n = above + below
    return 1.0 if n == 0 else float(stats.binomtest(above, n, 0.5).pvalue)


def paired_test(d: list[float]) -> dict[str, Any]:
    """Mean, 95 % Student-t interval, two-sided paired t-test p-value, the seeds' signs and the
    exact sign test's p-value. Identical non-zero differences have no t-test (t = mean / 0): p is
    NaN, which Holm leaves out of its family and tables print as '–'; the sign test still speaks."""
    from scipy import stats

    m, lo, hi = interval95(d)
    a = np.asarray(d, dtype=float)
    if len(a) < 2:
        p = math.nan
    elif a.std(ddof=1) == 0:
        p = 1.0 if m == 0 else math.nan
    else:
        p = float(stats.ttest_1samp(a, 0.0).pvalue)
    signs = (int((a > 0).sum()), int((a < 0).sum()))
    return {"interval": (m, lo, hi), "p": p, "signs": signs, "p_sign": sign_test(*signs)}


def fisher(collapsed_a: int, runs_a: int, collapsed_b: int, runs_b: int) -> float:
    """Two-sided Fisher's exact test that two arms collapse equally often (e.g. 0 of 5 against 5
    of 5: p = 2 / 252 = 0.0079, the smallest 5 runs an arm allow)."""
    from scipy import stats

    table = [[collapsed_a, runs_a - collapsed_a], [collapsed_b, runs_b - collapsed_b]]
    return float(stats.fisher_exact(table).pvalue)


def split(collapsed_a: int, runs_a: int, collapsed_b: int, runs_b: int) -> bool:
    """Whether two arms' outcomes split into collapsed and not: some run collapsed, not every
    one. A difference of accuracies is then bimodal and its t interval says little; the counts
    decide (`fisher`)."""
    total = collapsed_a + collapsed_b
    return 0 < total < runs_a + runs_b


def holm(pvalues: list[float], size: int | None = None) -> list[float]:
    """Holm's step-down adjustment (family-wise error rate), NaN kept out of the family. `size`:
    a family fixed beforehand (a plan's); the comparisons it holds beyond these, and any NaN
    here, count as p = 1, so that missing runs never shrink it."""
    if size is not None:
        pvalues = [1.0 if math.isnan(p) else p for p in pvalues]
    unseen = max(0, (size or 0) - len(pvalues))  # the family's comparisons not given, p = 1
    idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)), key=lambda i: pvalues[i])
    out, running = [math.nan] * len(pvalues), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (len(idx) + unseen - rank) * pvalues[i]))
        out[i] = running
    return out


def p_text(p: float) -> str:
    return "–" if math.isnan(p) else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"

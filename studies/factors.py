"""One factor at a time: what makes a regime's runs collapse (`feddb claims`, regime `cause`).

The exact point is conf/sweeps/sweep/exact_class.yaml's runs (the preset, in the authors' pool
order); the runs of cause_exact.yaml were made before the preset took that order, so each is the
`partition.pool_order=index` cell, with the one factor (a key of FACTORS) it flips besides. Per factor and method: collapsed runs
out of n with Fisher's exact test against the exact point, the final test accuracy, and the
paired per-seed difference from the exact point; per factor, DPL's paired effect on FixMatch. Two
runs of one seed are a pair by fssl/pairing.py's rule, the factor flipped excepted."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from feddb.stats import fisher, holm, interval95, p_text, paired_test, split
from fssl.methods import display_name
from fssl.pairing import pairable

CAUSE = "cause"  # the regime directory of the study (conf/sweeps/sweep/cause_exact.yaml: `out`)
PRESET = "miniature_authors_exact"
FACTORS = (
    *("partition.pool_order", "train.forward", "model.norm", "train.warmup_rounds"),
    "dataset.num_labeled",
)
# the value a factor had before the project had its key: runs made then are read as such
BUILT_IN = {"partition.pool_order": "index"}
EXACT = "the exact point"
# the regime whose runs are also the study's exact point (the exact preset in the authors' pool
# order, conf/sweeps/sweep/exact_class.yaml: `out`), and the rows of it that are
EXACT_CLASS, EXACT_ROWS = "exact_class", ("FixMatch", "FixMatch-FedDPL")


def lookup(cfg: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if part not in cfg:
            return BUILT_IN[key]
        cfg = cfg[part]
    return cfg


def study_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cause study's runs: the regime `cause`'s, and the FixMatch and FixMatch-FedDPL runs of
    the exact point in the authors' pool order (regime exact_class)."""
    return [
        r
        for r in runs
        if r["regime"] == CAUSE
        or (r["regime"] == EXACT_CLASS and method_of(r["cfg"]) in EXACT_ROWS)
    ]


def reference(factor: str) -> str:
    """The cell a cell is compared with: the one without its last factor (FACTORS' order), so
    that each comparison flips one factor (an index-order run's own factor is tested against the
    index-order exact point)."""
    return factor.rpartition(", ")[0] or EXACT


def factor_of(cfg: dict[str, Any], exact: dict[str, Any]) -> str:
    """The factors a run flips away from the exact preset, as `key=value`."""
    flipped = [f"{k}={lookup(cfg, k)}" for k in FACTORS if lookup(cfg, k) != lookup(exact, k)]
    return ", ".join(flipped) or EXACT


def method_of(cfg: dict[str, Any]) -> str:
    dpl = "-FedDPL" if cfg["dpl"] else ""
    prior = " (global prior)" if dpl and cfg.get("dpl_prior", "local") == "global" else ""
    return display_name(cfg["method"]) + dpl + prior


def pairs(
    a: dict[int, dict], b: dict[int, dict], varied: tuple[str, ...], name: str, left_out: list[str]
) -> list[int]:
    """Seeds whose runs in arms a and b are a pair (fssl/pairing.py; `varied`: the factors the
    comparison flips); each other seed's pair goes to `left_out` as one line, under `name`."""
    why = {s: pairable(a[s], b[s], varied) for s in sorted(set(a) & set(b))}
    left_out += [f"{name}, seed {s}: {w}" for s, w in why.items() if w]
    return [s for s, w in why.items() if not w]


def flipped(factor: str) -> tuple[str]:
    """The key of the one factor a cell flips against its reference (its last)."""
    return (factor.rpartition(", ")[2].partition("=")[0],)


def difference(a: dict[int, dict], b: dict[int, dict], seeds: list[int]) -> str:
    """a − b per seed in points: mean [95 % t interval] (sign test p; n pairs), and where the
    arms' runs split into collapsed and not, the counts with Fisher's p, which then decide."""
    if not seeds:
        return "–"
    d = [100 * a[s]["final"] - 100 * b[s]["final"] for s in seeds]  # as claims.py rounds
    test = paired_test(d)
    m, lo, hi = interval95(d)
    ci = f"{m:+.2f}" if np.isnan(lo) else f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"
    text = f"{ci} (sign test p {p_text(test['p_sign'])}; {len(seeds)} pairs)"
    ca, cb = (sum(bool(x[s]["collapsed"]) for s in seeds) for x in (a, b))
    if split(ca, len(seeds), cb, len(seeds)):
        text += (
            f"; collapsed {ca} vs {cb}, Fisher p {p_text(fisher(ca, len(seeds), cb, len(seeds)))}"
        )
    return text


def count(cell: dict[int, dict]) -> tuple[int, int]:
    """(collapsed runs, runs) of a cell's runs by seed."""
    return sum(bool(r["collapsed"]) for r in cell.values()), len(cell)


def markdown(runs: list[dict[str, Any]], exact: dict[str, Any]) -> list[str]:
    """The study's two tables: each factor × method against the exact point, and DPL's effect
    within each factor."""
    by: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for r in runs:
        by[(factor_of(r["cfg"], exact), method_of(r["cfg"]))][r["seed"]] = r
    left_out: list[str] = []  # pairs that are no pair, each with why
    factors = sorted({f for f, _ in by}, key=lambda f: (f != EXACT, f))
    methods = sorted({m for _, m in by})
    settings = sorted({r["setting"] for r in runs})
    out = [
        f"## Collapse in the exact regime, one factor at a time ({', '.join(settings)})",
        "",
        "Each row flips the factors it names of `experiment=miniature_authors_exact` and is "
        "compared with the row without its last factor (its reference: the exact point, or the "
        "index-order exact point), so that each comparison flips one factor. Collapsed: one "
        "class for more than half of the test images at the end; Fisher: two-sided exact test "
        "of the row's collapse count against its reference's, Holm-corrected over the method's "
        "factors (the question is which factor causes a collapse); the paired difference is over "
        "the seeds both ran on one kind of device.",
        "",
        "| factor flipped | method | runs | collapsed | Fisher p vs its reference | p, Holm over "
        "the method's factors | final test accuracy, % | − its reference, points |",
        "|---|---|---|---|---|---|---|---|",
    ]
    p_fisher = {
        (f, m): fisher(*count(by[(f, m)]), *count(by[(reference(f), m)]))
        for f, m in by
        if f != EXACT and by.get((reference(f), m))
    }
    p_holm = {}
    for m in methods:
        keys = [k for k in p_fisher if k[1] == m]
        p_holm.update(zip(keys, holm([p_fisher[k] for k in keys])))
    for f in factors:
        for m in methods:
            cell = by.get((f, m))
            if not cell:
                continue
            c, n = count(cell)
            finals = 100 * np.asarray([r["final"] for r in cell.values()])
            acc = f"{finals.mean():.2f}" + (f" ± {finals.std(ddof=1):.2f}" if n > 1 else "")
            p, ph = (p_text(d[(f, m)]) if (f, m) in d else "–" for d in (p_fisher, p_holm))
            vs = "–"
            if f != EXACT:  # against its reference, where the factor may differ
                base = by.get((reference(f), m), {})
                vs = difference(cell, base, pairs(cell, base, flipped(f), f"{f}, {m}", left_out))
            out.append(f"| {f} | {m} | {n} | {c} of {n} | {p} | {ph} | {acc} | {vs} |")
    with_dpl = [
        m for m in methods if m.endswith("-FedDPL") and m.removesuffix("-FedDPL") in methods
    ]
    if with_dpl:
        out += ["", "DPL within each factor, paired per seed:", ""]
        out += ["| factor flipped | comparison | difference, points |", "|---|---|---|"]
        for f in factors:
            for m in with_dpl:
                base = m.removesuffix("-FedDPL")
                if (f, m) in by and (f, base) in by:
                    a, b = by[(f, m)], by[(f, base)]
                    seeds = pairs(a, b, (), f"{f}, {m} − {base}", left_out)
                    out.append(f"| {f} | {m} − {base} | {difference(a, b, seeds)} |")
    if left_out:
        out += ["", "Pairs left out: " + "; ".join(left_out) + "."]
    return out + [""]


def tuned(run: dict[str, Any]) -> tuple[str, str, float | str] | None:
    """(row, the tuned key's short name, value) of a run a selection sweep made (`feddb sweep ...
    tune=<key> value=a,b,c`: its identity's selection), else None."""
    ident = run["identity"]
    sel = ident.get("selection")
    if not sel:
        return None
    name, value = sel["key"].rpartition(".")[2], sel["value"]
    try:
        return ident["row"], name, float(value)
    except ValueError:
        return ident["row"], name, value  # e.g. tune=model.norm value=bn,gn


def chosen(means: dict, val_images: int) -> float | str:
    """The value chosen on validation: the highest final validation accuracy (%) wins, and one
    within a binomial standard error of it is a tie, broken towards the smaller value (for an lr
    the smaller step, the safer guess when the split cannot tell them apart)."""
    if val_images < 1:
        raise ValueError("a selection needs a validation split (dataset.val_size > 0)")
    best = max(means.values())
    p = best / 100
    se = 100 * (p * (1 - p) / val_images) ** 0.5
    return min((v for v, acc in means.items() if acc >= best - se), key=lambda v: (str(type(v)), v))


def selection_markdown(runs: list[dict[str, Any]], regime: str) -> list[str]:
    """A selection's table: per setting and row, the final validation accuracy at each value
    (mean over the seeds run, seed 0 in the studies) and the value chosen (`chosen`)."""
    by: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    val_images: dict[tuple[str, str], int] = {}
    names = set()
    for r in runs:
        row, name, value = tuned(r)
        names.add(name)
        val = r["rounds"][-1].scores.val_accuracy
        if val is not None:
            by[(r["setting"], row)][value].append(100 * val)
            val_images[(r["setting"], row)] = int(r["cfg"]["dataset"].get("val_size") or 0)
    name = "/".join(sorted(names))
    values = sorted({v for cells in by.values() for v in cells}, key=lambda v: (str(type(v)), v))
    out = [
        f"## The {name} chosen on the validation split ({regime})",
        "",
        "Final validation accuracy, %, by value; chosen: the smallest value within one binomial "
        "standard error of the highest (a tie on the split is broken towards the smaller value).",
        "",
        "| setting | row | " + " | ".join(f"{name} {v}" for v in values) + " | chosen |",
        "|---" * (len(values) + 3) + "|",
    ]
    for (sett, row), cells in sorted(by.items()):
        means = {v: float(np.mean(acc)) for v, acc in cells.items()}
        best = chosen(means, val_images[(sett, row)])
        shown = [f"{means[v]:.2f}" if v in means else "–" for v in values]
        out.append(f"| {sett} | {row} | " + " | ".join(shown) + f" | {best} |")
    return [*out, ""]

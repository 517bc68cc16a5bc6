"""The paper's four claims, tested on the runs of the claims study (conf/sweeps/sweep/claims_*):

    feddb sweep -m sweep=claims_cpu          # and claims_authors, claims_cpu_more, ...
    feddb claims runs/claims --out docs/claims

Reads <root>/<regime>/<dataset>_<partition>/<row>/s<seed> (the sweeps' layout), names each run by
what it ran (the method, DPL, DMA and, without DMA, the weighting it fell back to), and writes
claims.md, claims.csv, runs.csv (every run, for `feddb reproduce`) and figures: per regime and setting, mean ± std over seeds of the final test
accuracy, the test accuracy at the best-validation round, the worst class's test accuracy and the
largest one-class share of test predictions (final, and averaged over the semi-supervised rounds);
the paired per-seed differences that test each claim, with 95 % intervals; a verdict per claim and
setting; and the per-round figures that show the mechanism (worst class, one-class share,
pseudo-labels, the paper's Figure 3 measure).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from feddb.plan import headline
from feddb.report import (
    check_groups,
    colours,
    curve_figure,
    embed,
    left_out_section,
    load_runs,
    out_problem,
)
from feddb.rows import Row, method_yaml, table
from feddb.runlist import write_runs
from feddb.stats import fisher, holm, interval95, p_text, paired_test, split
from fssl.methods import method_class
from fssl.pairing import pairable
from fssl.record import RoundMetrics, run_summary
from server_app.config import compose
from studies import factors, labelling

# (label, what the number is, larger is better)
METRICS = [
    ("final", "final test accuracy", True),
    ("selected", "test accuracy at the best-validation round", True),
    ("worst_final", "worst class, final", True),
    ("top_final", "one-class share, final", False),
    ("worst_ssl", "worst class, mean over the semi-supervised rounds", True),
    ("top_ssl", "one-class share, mean over the semi-supervised rounds", False),
]

UNIFORM, SIZES = "uniform", "n_m"
# The primary endpoint is final test accuracy (METRICS[0]); the rest are secondary. Each claim has
# one primary comparison per regime and setting, (a, b) with a - b > 0 supporting it; its verdict
# comes from the Holm-corrected paired test over the regime's primary comparisons. "FixMatch" and
# "FixMatch-FedDPL" stand for the regime's own weighting without DMA (n_m in the CPU regime,
# uniform in the authors'), "other" for the other one. Secondary comparisons are reported with
# their raw p-values and never decide a verdict. Pairs whose runs are absent are skipped.
NATIVE, OTHER = "{native}", "{other}"
CLAIMS = {
    "SSL helps": [
        (f"FixMatch, {NATIVE}", "FedAvg"),
        (f"FixMatch, {OTHER}", "FedAvg"),
        ("FedDB", "FedAvg"),
    ],
    "DPL helps": [
        (f"FixMatch-FedDPL, {NATIVE}", f"FixMatch, {NATIVE}"),
        (f"FixMatch-FedDPL, {OTHER}", f"FixMatch, {OTHER}"),
        ("FedDB", "FedDB w/o DPL"),
    ],
    "DMA helps": [
        ("FedDB w/o DPL", f"FixMatch, {NATIVE}"),
        ("FedDB w/o DPL", f"FixMatch, {OTHER}"),
        ("FedDB", f"FixMatch-FedDPL, {NATIVE}"),
        ("FedDB, literal DMA", f"FixMatch-FedDPL, {NATIVE}"),
        ("FedDB, literal DMA", "FedDB"),
    ],
    "FedDB beats FixMatch": [
        ("FedDB", f"FixMatch, {NATIVE}"),
        ("FedDB", f"FixMatch, {OTHER}"),
        ("FedDB, literal DMA", f"FixMatch, {NATIVE}"),
    ],
    # not the paper's: DPL dividing by the server's aggregated APP-U instead of the client's own
    "The global prior helps": [
        (f"FixMatch-FedDPL (global prior), {NATIVE}", f"FixMatch-FedDPL, {NATIVE}"),
    ],
}
PROJECT = Path(__file__).resolve().parents[1]
PLAN = PROJECT / "studies" / "plans" / "claims.yaml"


def plan() -> dict[str, Any]:
    """The study's plan (studies/plans/claims.yaml): endpoint, test, alpha, each regime's family
    and whether it was fixed before the regime's runs."""
    return yaml.safe_load(PLAN.read_text())


ALPHA = plan()["alpha"]  # family-wise error rate of each regime's verdicts (Holm)


def plan_lines(regimes) -> list[str]:
    """The plan by the commit that last changed it, and each regime's family as it records it."""
    p = plan()
    out = [headline(PLAN, p)]
    for regime in sorted(regimes):
        spec = p["regimes"].get(regime)
        family = spec and spec["family"]
        if isinstance(family, list):
            family = "; ".join(f"{a} − {b}" for a, b in family)
        out.append(
            f"- {regime}: family fixed {spec['fixed']}; {family}."
            if spec
            else f"- {regime}: not in the plan (its family was not fixed before its runs)."
        )
    return out


# the study's rows (conf/comparison/paper.yaml), in the tables' order: FedDB's FixMatch client
# with and without DPL and DMA, and labels-only FedAvg
ROWS = (
    *("fedavg", "fixmatch", "fixmatch-feddpl", "fixmatch-feddpl-global"),
    *("feddb-without-dpl", "feddb", "feddb-literal-dma"),
)


def switches(row: Row) -> tuple[bool, str | None, bool, str | None]:
    """A row's (DPL, what DPL divides by, DMA, DMA's mode) as it runs."""
    m = method_yaml(row.method)
    dpl = bool(m.get("dpl")) if row.dpl is None else row.dpl
    dma = bool(m.get("dma")) if row.dma is None else row.dma
    modes = [o.split("=", 1)[1] for o in row.overrides.split() if o.startswith("dma.mode=")]
    prior = (row.prior or "local") if dpl else None
    return dpl, prior, dma, (modes[-1] if modes else "softmax") if dma else None


def labels() -> list[str]:
    """The study's labels in order: a row's display name, and for FixMatch's client without DMA
    one label for each weighting it averages with instead."""
    out = []
    for name in ROWS:
        row = table()[name]
        if name == ROWS[0] or switches(row)[2]:
            out.append(row.display)
        else:
            out += [f"{row.display}, {w}" for w in (UNIFORM, SIZES)]
    return out


def label(cfg: dict[str, Any]) -> str:
    """What a run ran: labels-only FedAvg, or the study's row whose DPL, DMA and DMA mode it ran
    (FedDB's FixMatch client), with the weighting for the runs without DMA."""
    if not method_class(cfg["method"]["trainer"]).uses_unlabeled:
        return table()[ROWS[0]].display
    dpl, dma = bool(cfg["dpl"]), bool(cfg["dma"]["enabled"])
    prior = cfg.get("dpl_prior", "local") if dpl else None
    ran = (dpl, prior, dma, cfg["dma"].get("mode", "softmax") if dma else None)
    row = next(table()[n] for n in ROWS[1:] if switches(table()[n]) == ran)
    if dma:
        return row.display
    weighting = UNIFORM if cfg["server"]["weighting"] == "uniform" else SIZES
    return f"{row.display}, {weighting}"


def setting_of(cfg: dict[str, Any]) -> str:
    p = cfg["partition"]
    if p.get("imbalance_ratio"):
        return f"long-tailed pool, ratio {p['imbalance_ratio']:g}" + (
            "" if p["mode"] == "iid" else f", δ={p['delta']}"
        )
    return "IID" if p["mode"] == "iid" else f"δ={p['delta']}"


SMOOTH = 5  # rounds in the figures' trailing means (one round's values swing widely)
SETTING_ORDER = [
    "δ=0.1",
    "δ=0.3",
    "IID",
    "long-tailed pool, ratio 10",
    "long-tailed pool, ratio 100",
]


def ordered(names, order: list[str]) -> list[str]:
    return sorted(set(names), key=lambda n: (order.index(n) if n in order else len(order), n))


def semi_rounds(run: dict[str, Any]) -> list[RoundMetrics]:
    """The evaluated rounds after the labels-only warm-up."""
    warm = run["cfg"]["train"]["warmup_rounds"]
    return [r for r in run["rounds"] if r.round > warm and r.scores.class_accuracy]


def measures(run: dict[str, Any]) -> dict[str, float | None]:
    last = [r.scores for r in run["rounds"] if r.scores.class_accuracy][-1]
    semi = semi_rounds(run)
    moved = [
        float(np.abs(np.subtract(c["app_u"], c["app_u_global"])).sum())
        for r in semi
        for c in r.clients
        if len(c.get("app_u", [])) == len(c.get("app_u_global", [])) > 0
    ]
    ssl = [r.scores for r in semi]
    return {
        "final": run["final"],
        "selected": run["selected"],
        "worst_final": min(last.class_accuracy),
        "top_final": last.top_class_share,
        "worst_ssl": float(np.mean([min(r.class_accuracy) for r in ssl])) if ssl else None,
        "top_ssl": float(np.mean([r.top_class_share for r in ssl])) if ssl else None,
        "app_u_moved": float(np.mean(moved)) if moved else None,
    }


def load(root: Path, left_out: list[str] | None = None) -> list[dict[str, Any]]:
    """Finished runs below root/<regime>/, each with its regime, setting, label and measures;
    the others listed in `left_out` (feddb.report.load_runs)."""
    out = []
    for regime_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for run in load_runs([regime_dir], left_out):
            summary = run_summary(run["rounds"])
            run.update(
                regime=regime_dir.name,
                setting=setting_of(run["cfg"]),
                variant=label(run["cfg"]),
                defence_rounds=summary["defence_rounds"],
                **measures(run),
            )
            out.append(run)
    return out


def pct(v: float) -> float:
    """Accuracies and shares in percentage points."""
    return 100 * v


def native_weighting(runs: list[dict[str, Any]]) -> str:
    """The weighting a cell's runs average with when DMA is off: the regime's own (most runs use
    it; a row that overrides it, fixmatch-uniform in the CPU regime, is the minority)."""
    votes = [r["cfg"]["server"]["weighting"] for r in runs]
    native = max(sorted(set(votes)), key=votes.count)
    return UNIFORM if native == "uniform" else SIZES


def paired_seeds(ra: dict[int, dict], rb: dict[int, dict]) -> tuple[list[int], dict[int, str]]:
    """The seeds both arms ran whose runs are a pair (fssl/pairing.py), and why each other seed's
    are not. A comparison none of whose pairs holds keeps all its seeds, unmatched: claims.csv
    shows its difference, and it gives no verdict."""
    seeds = sorted(set(ra) & set(rb))
    why = {s: w for s in seeds if (w := pairable(ra[s], rb[s]))}
    return [s for s in seeds if s not in why] or seeds, why


def comparisons(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per regime and setting, every claim's comparisons: paired per-seed differences of each
    metric on the seeds both variants have; for the primary endpoint also the p-value, the seeds'
    signs, whether the warm-ups matched, and (primary comparisons) the Holm-corrected p-value
    within the regime."""
    by: dict[tuple[str, str, str], dict[int, dict]] = defaultdict(dict)
    for r in runs:
        by[(r["regime"], r["setting"], r["variant"])][r["seed"]] = r
    planned = planned_families()
    out = []
    for regime in sorted({r["regime"] for r in runs}):
        family = []
        for sett in ordered((r["setting"] for r in runs if r["regime"] == regime), SETTING_ORDER):
            cell = [r for r in runs if r["regime"] == regime and r["setting"] == sett]
            native = native_weighting(cell)
            other = SIZES if native == UNIFORM else UNIFORM
            for claim, pairs in CLAIMS.items():
                for rank, (a, b) in enumerate(pairs):
                    a, b = (x.format(native=native, other=other) for x in (a, b))
                    ra, rb = by.get((regime, sett, a), {}), by.get((regime, sett, b), {})
                    seeds, why = paired_seeds(ra, rb)
                    if not seeds:
                        continue
                    row = {
                        "regime": regime,
                        "setting": sett,
                        "claim": claim,
                        "a": a,
                        "b": b,
                        "seeds": seeds,
                        "primary": decides(planned.get(regime), rank, a, b, native),
                        "matched": any(s not in why for s in seeds),
                        "left_out": why,
                        "p_holm": math.nan,
                    }
                    for key, _, better_up in METRICS:
                        d = [
                            pct(ra[s][key]) - pct(rb[s][key])
                            for s in seeds
                            if ra[s][key] is not None and rb[s][key] is not None
                        ]
                        if not better_up:
                            d = [-x for x in d]  # a smaller one-class share supports it
                        row[key] = interval95(d) if d else None
                        if key == METRICS[0][0]:
                            test = paired_test(d)
                            row["p"], row["signs"] = test["p"], test["signs"]
                            row["p_sign"] = test["p_sign"]
                    row.update(collapse_test(ra, rb, seeds))
                    out.append(row)
                    if row["primary"] and row["matched"]:
                        family.append(row)
        for row, adjusted in zip(family, family_holm_p(family, planned.get(regime))):
            row["p_holm"] = adjusted
    return out


def family_holm_p(family: list[dict[str, Any]], planned: list[list[str]] | None) -> list[float]:
    """Holm over a regime's family. A planned family keeps the plan's size: a comparison it lists
    that has no p (runs missing, one seed) counts as p = 1, never shrinking the family."""
    ps = [deciding_p(r) for r in family]
    if planned is None:
        return holm(ps)
    return holm(ps, size=len(planned) * (len({r["setting"] for r in family}) or 1))


def planned_families() -> dict[str, list[list[str]]]:
    """The regimes whose plan lists its family's comparisons (fixed before their runs), each
    with its (a, b) pairs of names, e.g. ["FixMatch-FedDPL", "FixMatch"]."""
    regimes = plan()["regimes"]
    return {g: spec["family"] for g, spec in regimes.items() if isinstance(spec["family"], list)}


def decides(family: list[list[str]] | None, rank: int, a: str, b: str, native: str) -> bool:
    """Whether comparison a − b is primary (in its regime's Holm family): one of the plan's pairs
    (a name stands for the run without DMA under the regime's own weighting too), or, for a
    regime whose plan lists none, the first of its claim's rows."""
    if family is None:
        return rank == 0

    def named(run_label: str, name: str) -> bool:
        return run_label in (name, f"{name}, {native}")

    return any(named(a, x) and named(b, y) for x, y in family)


def collapse_test(ra: dict[int, dict], rb: dict[int, dict], seeds: list[int]) -> dict[str, Any]:
    """The two arms' collapsed runs on the seeds they share, and Fisher's exact test of them."""
    ca = sum(bool(ra[s]["collapsed"]) for s in seeds)
    cb = sum(bool(rb[s]["collapsed"]) for s in seeds)
    n = len(seeds)
    return {
        "collapsed": (ca, cb),
        "p_fisher": fisher(ca, n, cb, n),
        "on_counts": split(ca, n, cb, n),
    }


def shared_start(cell: list[dict[str, Any]]) -> str:
    """What a cell's pairs share before their methods part: the warm-up, where the regime has one."""
    if any(r["cfg"]["train"]["warmup_rounds"] for r in cell):
        return "their warm-up (the same global model, round by round)"
    return "their seed's partition and initial model (the regime has no warm-up)"


def deciding_p(row: dict[str, Any]) -> float:
    """The p-value a comparison is decided by: Fisher's on the collapse counts where the arms'
    outcomes split into collapsed and not (a bimodal difference), else the paired t-test's."""
    return row["p_fisher"] if row["on_counts"] else row["p"]


def verdict(row: dict[str, Any]) -> str:
    """holds / fails: the Holm-corrected test rejects no difference, in the claim's direction or
    against it; not shown otherwise. Unmatched warm-ups and single seeds give no verdict."""
    if not row["matched"]:
        return "unmatched"
    if len(row["seeds"]) < 2:
        return "one seed"
    if not row["p_holm"] < ALPHA:
        return "not shown"
    if row["on_counts"]:  # fewer collapses in a supports the claim
        ca, cb = row["collapsed"]
        return "holds" if ca < cb else "fails"
    return "holds" if row[METRICS[0][0]][0] > 0 else "fails"


def verdict_text(row: dict[str, Any]) -> str:
    """A verdict with the figures it rests on: the collapse counts and Fisher's p where they
    decide, else the interval and the sign test's p; then Holm's p."""
    if row["on_counts"]:
        ca, cb = row["collapsed"]
        n = len(row["seeds"])
        basis = f"collapsed {ca} of {n} vs {cb} of {n}, Fisher p {p_text(row['p_fisher'])}"
    else:
        basis = f"{interval_text(row['final'])}, sign test p {p_text(row['p_sign'])}"
    return f"{verdict(row)} ({basis}, p_Holm {p_text(row['p_holm'])})"


# The README's main result: the CPU and the authors' regimes at δ = 0.1 and 0.3
README_CELLS = [(g, s) for g in ("cpu", "authors") for s in ("δ=0.1", "δ=0.3")]
REGIME_NAMES = {"cpu": "CPU", "authors": "authors'"}


# Holm's families: a regime's primary comparisons (the published verdicts), the README's cells of a
# regime, and every primary comparison. All three were chosen after the runs they correct (Holm came
# at 0fa077d, after the last claims run), so a verdict that moves with the family depends on it.
FAMILIES = {
    "regime": lambda r: r["regime"],
    "README cells": lambda r: r["regime"] if (r["regime"], r["setting"]) in README_CELLS else None,
    "all": lambda r: "all",
}
FAMILY_TEXT = {
    "regime": "a regime's primary comparisons (the verdicts above)",
    "README cells": "the README's cells of a regime",
    "all": "every primary comparison",
}


def family_holm(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Each primary, matched comparison's Holm p under each of FAMILIES (NaN outside it), and
    each family's size (its largest group)."""
    planned = planned_families()
    decided = [r for r in rows if r["primary"] and r["matched"] and r["regime"] not in planned]
    out = [dict.fromkeys(FAMILIES, math.nan) for _ in decided]
    sizes = {}
    for name, key in FAMILIES.items():
        groups: dict[Any, list[int]] = defaultdict(list)
        for i, r in enumerate(decided):
            if key(r) is not None:
                groups[key(r)].append(i)
        for members in groups.values():
            for i, p in zip(members, holm([deciding_p(decided[i]) for i in members])):
                out[i][name] = p
        sizes[name] = max(map(len, groups.values()), default=0)
    return [dict(p, row=r) for p, r in zip(out, decided)], sizes


def family_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The verdicts that move with Holm's family, as a table."""
    ps, sizes = family_holm(rows)
    moved = [f for f in ps if len({f[n] < ALPHA for n in FAMILIES if not math.isnan(f[n])}) > 1]
    out = [
        "## Verdicts under other families",
        "",
        "The families of the regimes the plan does not list were chosen after the runs. Holm's "
        "p of each of their primary comparisons whose "
        f"significance (α = {ALPHA}) changes with the family, the families being "
        + "; ".join(f"{n}: {FAMILY_TEXT[n]} ({sizes[n]})" for n in FAMILIES)
        + ". Such a verdict depends on the family.",
        "",
    ]
    if not moved:
        return out[:3] + ["No verdict changes with the family.", ""]
    out += ["| regime | setting | claim | " + " | ".join(FAMILIES) + " |", "|---" * 6 + "|"]
    for f in moved:
        r = f["row"]
        ps = " | ".join(p_text(f[n]) for n in FAMILIES)
        out.append(f"| {r['regime']} | {r['setting']} | {r['claim']} | {ps} |")
    return [*out, ""]


def readme_table(claims: list[dict[str, str]], runs: list[dict[str, str]]) -> str:
    """The README's table (`feddb tables`, from claims.csv and runs.csv): each claim's primary
    comparison per regime and setting, bold where the Holm-corrected test decides it, the collapse
    counts where they decide; then the provenance of the runs it rests on."""
    primary = {(r["regime"], r["setting"], r["claim"]): r for r in claims if r["primary"] == "1"}
    cells = [c for c in README_CELLS if any(k[:2] == c for k in primary)]
    head = [f"{REGIME_NAMES[g]}, {s.replace('=', ' = ')}" for g, s in cells]
    lines = ["| claim (points, 95 % interval) | " + " | ".join(head) + " |"]
    lines.append("|---" * (len(cells) + 1) + "|")
    for claim in CLAIMS:
        rows = [primary.get((*c, claim)) for c in cells]
        first = next((r for r in rows if r), None)
        if first:
            a, b = (first[k].split(", ")[0] for k in ("a", "b"))
            name = (claim.removesuffix(" helps") + ": ") * claim.endswith(" helps") + f"{a} − {b}"
            lines.append(f"| {name} | " + " | ".join(map(readme_cell, rows)) + " |")
    shown = [r for r in runs if (r["regime"], r["partition"].replace("dir", "δ=")) in set(cells)]
    return "\n".join([*lines, "", readme_provenance(shown)])


def readme_cell(row: dict[str, str] | None) -> str:
    if row is None:
        return "–"
    decided = row["verdict"] in ("holds", "fails")
    if row["decided_on_counts"] == "1":
        n = len(row["seeds"].split())
        text = f"collapsed {row['collapsed_a']} of {n} vs {row['collapsed_b']} of {n}"
        return f"**{text}**" if decided else text
    text = interval_text(tuple(float(row[f"final_{k}"] or "nan") for k in ("mean", "low", "high")))
    mean, _, interval = text.partition(" ")  # one seed: the mean alone
    return (f"**{mean}** {interval}".rstrip() if decided else text).replace("-", "−")


def readme_provenance(runs: list[dict[str, str]]) -> str:
    """One line: how many runs, on which machines, when, at which commits, with which seeds."""
    if not runs:
        return "No runs."
    runs = sorted(runs, key=lambda r: (r.get("date", ""), r["commit"]))
    commits = list(dict.fromkeys(r["commit"][:7] for r in runs))
    dates = [(r.get("date") or "date unknown")[:10] for r in runs]
    seeds = sorted({int(r["seed"]) for r in runs})
    contiguous = len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1))
    return (
        f"{len(runs)} runs, {', '.join(sorted({r['hardware'] for r in runs}))}, "
        f"{' to '.join(dict.fromkeys([dates[0], dates[-1]]))}, "
        + ("commit " if len(commits) == 1 else "commits ")
        + " to ".join(dict.fromkeys([commits[0], commits[-1]]))
        + f", seeds {f'{seeds[0]}-{seeds[-1]}' if contiguous else ', '.join(map(str, seeds))}."
    )


def interval_text(v: tuple[float, float, float] | None) -> str:
    if v is None:
        return "–"
    m, lo, hi = v
    return f"{m:+.2f}" if math.isnan(lo) else f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def mean_std(values: list[float]) -> str:
    a = 100 * np.asarray([v for v in values if v is not None], dtype=float)
    if not len(a):
        return "–"
    return f"{a.mean():.2f}" + (f" ± {a.std(ddof=1):.2f}" if len(a) > 1 else "")


def provenance_line(runs: list[dict[str, Any]]) -> str:
    """The runs' code, dates, machine and seeds in one line: the first and last commit the runs
    were started at (check that the training code is the same between them with `git diff`)."""
    provs = sorted((r["provenance"] for r in runs), key=lambda p: str(p.get("date", "")))
    commits = list(dict.fromkeys(str(p.get("commit"))[:7] for p in provs))
    dirty = sum(bool(p.get("dirty")) for p in provs)
    dates = [str(p.get("date", ""))[:10] for p in provs if p.get("date")]
    machines: dict[str, int] = {}
    for p in provs:
        if p.get("hardware"):
            on_gpu = str(p.get("device", "")).startswith("cuda")
            where = f"{p['hardware']}, " + ("on the GPU" if on_gpu else "one CPU thread each")
            machines[where] = machines.get(where, 0) + 1
    hardware = [f"{n} runs on {where}" for where, n in sorted(machines.items())]
    seeds = sorted({r["seed"] for r in runs})
    span = " to ".join(dict.fromkeys([dates[0], dates[-1]])) if dates else "date unknown"
    code = (
        f"commit {commits[0]}"
        if len(commits) == 1
        else f"commits {commits[0]} to {commits[-1]} ({len(commits)} commits)"
    )
    return (
        f"Provenance: {len(runs)} complete runs, started at {code}"
        + (f", {dirty} of them with uncommitted changes in the tree" if dirty else "")
        + f"; {span}; {'; '.join(hardware) or 'hardware unknown'}; "
        f"seeds {', '.join(map(str, seeds))} (per cell below)."
    )


def markdown(runs: list[dict[str, Any]], rows: list[dict[str, Any]], figs: list[Path]) -> str:
    out = ["# The paper's claims, tested", "", provenance_line(runs), ""]
    out += [*plan_lines({r["regime"] for r in runs}), ""]
    acted = [r for r in runs if any(r["defence_rounds"].values())]
    out += [
        f"Defences that changed an aggregate: {len(acted)} of {len(runs)} runs "
        "(a simulation runs the methods as published).",
        "",
    ]
    # verdicts: a cell whose comparisons rest on one seed each (a reproduction record) has none
    cells = [
        (g, s)
        for g in sorted({r["regime"] for r in runs})
        for s in ordered((r["setting"] for r in runs if r["regime"] == g), SETTING_ORDER)
    ]
    decided = [
        c
        for c in cells
        if any(len(r["seeds"]) > 1 for r in rows if (r["regime"], r["setting"]) == c)
    ]
    out += [
        "## Verdicts",
        "",
        "Primary endpoint: final test accuracy. Each claim is decided in each cell by one "
        "comparison (the plan's, where it lists the regime's family; else the first of its "
        "rows below: FixMatch under the regime's own weighting), a paired t-test over seeds "
        "(the exact sign test beside it), or, where the two arms' runs split into collapsed and "
        "not, Fisher's exact test on the collapse counts; Holm-corrected over the regime's "
        f"primary comparisons (family-wise α = {ALPHA}); the other rows and metrics are "
        "secondary.",
        "",
        "| claim | " + " | ".join(f"{g}, {s}" for g, s in decided) + " |",
        "|---" * (len(decided) + 1) + "|",
    ]
    for claim in CLAIMS:
        vals = []
        for cell in decided:
            mine = [
                r
                for r in rows
                if (r["regime"], r["setting"]) == cell and r["claim"] == claim and r["primary"]
            ]
            vals.append("–" if not mine else verdict_text(mine[0]))
        out.append(f"| {claim} | " + " | ".join(vals) + " |")
    out += [
        "",
        "holds: the corrected test finds a difference and it is > 0; fails: it finds one and it "
        "is < 0; not shown: it finds none; unmatched: the two arms' warm-ups differ (no verdict).",
        "",
        *family_lines(rows),
    ]
    # per-cell tables
    for regime, sett in cells:
        rs = [r for r in runs if r["regime"] == regime and r["setting"] == sett]
        out += [
            f"## {regime} regime, {sett}",
            "",
            "| run | seeds | final, % | at best validation, % | worst class, final, % | "
            "one-class share, final, % | worst class, semi rounds, % | one-class share, semi "
            "rounds, % | APP-U moved by local training (L1) | collapsed |",
            "|---" * 10 + "|",
        ]
        for var in ordered((r["variant"] for r in rs), labels()):
            v = [r for r in rs if r["variant"] == var]
            moved = [r["app_u_moved"] for r in v if r["app_u_moved"] is not None]
            out.append(
                f"| {var} | {len(v)} | "
                + " | ".join(mean_std([r[k] for r in v]) for k, _, _ in METRICS)
                + f" | {f'{np.mean(moved):.3f}' if moved else '–'} | "
                + f"{sum(r['collapsed'] for r in v)} |"
            )
        out += [
            "",
            "Paired per-seed differences, points (95 % interval; one-class share: "
            "reduction, so > 0 supports the claim). p: paired t-test on the final accuracy; "
            "p_Holm: corrected, primary comparisons only (of Fisher's p where the collapse "
            "counts decide); signs: seeds above / below 0, with the exact sign test's p; "
            "collapsed: runs of each arm (Fisher's exact p). Both arms of each comparison share "
            + shared_start(rs)
            + " and kind of device:",
            "",
            "| claim | comparison | seeds | "
            + " | ".join(t for _, t, _ in METRICS)
            + " | p | p_Holm | signs (sign test p) | collapsed (Fisher p) |",
            "|---" * (len(METRICS) + 7) + "|",
        ]
        mine = [r for r in rows if (r["regime"], r["setting"]) == (regime, sett)]
        for r in mine:
            if r["matched"]:
                out.append(
                    f"| {r['claim']}{'' if r['primary'] else ' (secondary)'} | "
                    f"{r['a']} − {r['b']} | {len(r['seeds'])} | "
                    + " | ".join(interval_text(r[k]) for k, _, _ in METRICS)
                    + f" | {p_text(r['p'])} | {p_text(r['p_holm'])} | "
                    f"{r['signs'][0]}+ {r['signs'][1]}− ({p_text(r['p_sign'])}) | "
                    f"{r['collapsed'][0]}; {r['collapsed'][1]} ({p_text(r['p_fisher'])}) |"
                )
        out += [line for why in left_out_lines(mine) for line in ("", why)]
        out += ["", *labelling.markdown(rs, pairable)]
    return "\n".join(out) + embed(figs)


def left_out_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Why comparisons, or some of their pairs, are left out of a cell's table (fssl/pairing.py):
    per reason, the comparisons none of whose pairs holds; then each pair left out of the rest."""
    whole: dict[str, list[str]] = defaultdict(list)
    pairs = []
    for r in rows:
        name = f"{r['a']} − {r['b']}"
        if not r["matched"]:
            whole["; ".join(dict.fromkeys(r["left_out"].values()))].append(name)
        else:
            pairs += [f"{name}, seed {s}: {why}" for s, why in r["left_out"].items()]
    lines = [
        f"Left out, {why} (claims.csv keeps them, matched = 0): "
        + "; ".join(dict.fromkeys(names))
        + "."
        for why, names in whole.items()
    ]
    return lines + (["Pairs left out: " + "; ".join(dict.fromkeys(pairs)) + "."] if pairs else [])


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["regime", "setting", "claim", "a", "b", "seeds", "primary", "matched"]
            + [f"{k}_{part}" for k, _, _ in METRICS for part in ("mean", "low", "high")]
            + ["p", "p_holm", "seeds_above", "seeds_below", "verdict"]
            + ["p_sign", "collapsed_a", "collapsed_b", "p_fisher", "decided_on_counts"]
        )
        for r in rows:
            vals = []
            for k, _, _ in METRICS:
                vals += [
                    "" if r[k] is None or math.isnan(x) else f"{x:.4f}"
                    for x in (r[k] or (math.nan,) * 3)
                ]
            w.writerow(
                [
                    r["regime"],
                    r["setting"],
                    r["claim"],
                    r["a"],
                    r["b"],
                    " ".join(map(str, r["seeds"])),
                    int(r["primary"]),
                    int(r["matched"]),
                ]
                + vals
                + ["" if math.isnan(x) else f"{x:.6g}" for x in (r["p"], r["p_holm"])]
                + [*r["signs"], verdict(r) if r["primary"] else ""]
                + [f"{r['p_sign']:.6g}", *r["collapsed"], f"{r['p_fisher']:.6g}"]
                + [int(r["on_counts"])]
            )


def figures(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    written = []
    col = colours([r["variant"] for r in runs])
    for regime in sorted({r["regime"] for r in runs}):
        by: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for r in runs:
            if r["regime"] == regime:
                by[r["setting"]][r["variant"]].append(r)
        by = {s: by[s] for s in ordered(by, SETTING_ORDER)}
        semi = lambda r: r["cfg"]["method"]["trainer"] != "supervised"  # noqa: E731
        written.append(
            curve_figure(
                by,
                col,
                out / f"{regime}_classes.png",
                [
                    (
                        "worst class",
                        lambda x: min(x.scores.class_accuracy or [None]),
                        "test accuracy of the worst class",
                    ),
                    (
                        "one-class share",
                        lambda x: x.scores.top_class_share,
                        "share of the most-predicted class",
                    ),
                ],
                f"{regime} regime: the worst class's test accuracy and the largest one-class share of "
                f"test predictions per round (mean ± std over seeds, trailing mean of {SMOOTH} rounds)",
                smooth=SMOOTH,
            )
        )
        written.append(
            curve_figure(
                by,
                col,
                out / f"{regime}_pseudo_labels.png",
                [
                    (
                        "pseudo-label accuracy",
                        lambda x: x.pseudo_label_accuracy_pooled,
                        "accuracy of confident pseudo-labels",
                    ),
                    (
                        "pseudo-label ratio",
                        lambda x: x.pseudo_label_ratio,
                        "share confident",
                    ),
                ],
                f"{regime} regime: confident pseudo-labels per round (trailing mean of {SMOOTH} rounds)",
                only=semi,
                smooth=SMOOTH,
            )
        )
        written.append(
            curve_figure(
                by,
                col,
                out / f"{regime}_figure3.png",
                [("APP-U vs class accuracy", lambda x: x.js_divergence, "JS divergence")],
                f"{regime} regime: the paper's Figure 3 measure, JS divergence between the received "
                f"model's APP-U and its normalised class-wise accuracy (trailing mean of {SMOOTH} "
                "rounds)",
                only=semi,
                smooth=SMOOTH,
            )
        )
    return written


# what a record keeps (the rest of metrics.jsonl is per-client detail no table reads)
ROUND_KEYS = (
    "round",
    "evaluated",
    "test_accuracy",
    "val_accuracy",
    "top_class_share",
    "collapsed",
    "class_accuracy",
    "pseudo_label_accuracy",
    "pseudo_label_accuracy_pooled",
    "pseudo_label_ratio",
    "js_divergence",
    "js_divergence_labeled",
    "lr",
    "skipped",
)
RUN_FILES = ("config.yaml", "summary.json", "provenance.json", "run_config.json", "identity.json")


def _rounded(x: Any) -> Any:
    """Floats to 7 decimals: every table and interval comes out the same, at a third the size."""
    if isinstance(x, float):
        return round(x, 7)
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def trimmed(record: RoundMetrics) -> dict[str, Any]:
    rb, dma, line = record.robust or {}, record.dma, record.to_dict()
    return _rounded(
        {
            **{k: line.get(k) for k in ROUND_KEYS},
            "clients": [
                {k: c.get(k) for k in ("partition_id", "app_u", "app_u_global", "weight")}
                for c in record.clients
            ],
            "robust": {
                k: rb[k] for k in ("rule", "clip", "clipped", "dropped", "loss_dropped") if k in rb
            },
            "dma": None
            if dma is None
            else {
                k: dma.get(k)
                for k in (
                    "at_cap",
                    "cap",
                    "weight_entropy",
                    "loss_weights",
                    "loss_uniform",
                    "weights",
                )
            },
        }
    )


def archive(runs: list[dict[str, Any]], root: Path, path: Path) -> None:
    """The records behind the tables, as <root name>/<regime>/.../s<seed>/ in a .tar.xz: each
    run's configuration, summary, provenance and run-config, and its metrics trimmed to what the
    report reads. Unpacked beside the runs (`tar xJf ... -C runs`), the sweeps skip them and
    `feddb claims` gives the same tables."""
    import io
    import tarfile

    with tarfile.open(path, "w:xz") as tar:
        for run in sorted(runs, key=lambda r: str(r["dir"])):
            rel = Path(root.resolve().name) / run["dir"].resolve().relative_to(root.resolve())
            files = {
                name: (run["dir"] / name).read_bytes()
                for name in RUN_FILES
                if (run["dir"] / name).is_file()
            }
            files["metrics.jsonl"] = "".join(
                json.dumps(trimmed(r)) + "\n" for r in run["rounds"]
            ).encode()
            for name, data in files.items():
                info = tarfile.TarInfo(str(rel / name))
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("root", help="the claims sweeps' output root (runs/claims)")
    ap.add_argument("--out", default="reports/claims", help="where claims.md, .csv, PNGs go")
    ap.add_argument("--archive", help="also write the runs' records (trimmed) to this .tar.xz")
    args = ap.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        print(f"error: not a directory: {root}", file=sys.stderr)
        return 2
    if out_problem(Path(args.out)):
        print(f"error: {out_problem(Path(args.out))}", file=sys.stderr)
        return 2
    left_out: list[str] = []
    everything = load(root, left_out)
    for line in left_out:
        print(f"[claims] left out {line}", file=sys.stderr)
    selections = [r for r in everything if factors.tuned(r)]
    cause = factors.study_runs([r for r in everything if not factors.tuned(r)])
    runs = [r for r in everything if r["regime"] != factors.CAUSE and not factors.tuned(r)]
    if not everything:
        print(
            f"error: no complete runs below {root}/<regime>/ (run `feddb sweep -m "
            "sweep=claims_cpu` first)",
            file=sys.stderr,
        )
        return 2
    for regime in sorted({r["regime"] for r in runs}):  # a cell: one run a seed, one setting
        problem = check_groups([r for r in runs if r["regime"] == regime], False)
        if problem:
            print(f"error: {regime}: {problem}", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = comparisons(runs)
    figs = figures(runs, out) if runs else []
    text = markdown(runs, rows, figs) if runs else "# The paper's claims, tested\n"
    if cause:
        exact = compose([f"experiment={factors.PRESET}"])
        table = factors.markdown(cause, exact)
        text += "\n\n" + "\n".join(table[:2] + [provenance_line(cause), ""] + table[2:])
    for regime in sorted({r["regime"] for r in selections}):
        mine = [r for r in selections if r["regime"] == regime]
        table = factors.selection_markdown(mine, regime)
        text += "\n\n" + "\n".join(table[:2] + [provenance_line(mine), ""] + table[2:])
    text += left_out_section(left_out)
    (out / "claims.md").write_text(text)
    write_csv(rows, out / "claims.csv")
    cells = sorted({(r["regime"], r["setting"]) for r in rows})
    for regime, sett in cells:
        mine = [r for r in rows if (r["regime"], r["setting"]) == (regime, sett)]
        for line in left_out_lines(mine):
            print(f"[claims] {regime}, {sett}: {line}", file=sys.stderr)
    write_runs(everything, out / "runs.csv")
    if args.archive:
        archive(everything, root, Path(args.archive))
    print(text)
    print(
        f"[claims] {len(runs)} runs; wrote {out / 'claims.md'}, claims.csv and {len(figs)} figures"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

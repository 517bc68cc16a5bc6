"""Tables and figures from run directories, in the paper's layout.

    feddb report runs/sweep --out reports/sweep

Reads every run directory below the given paths (a directory with config.yaml and metrics.jsonl),
names each run by its row of the table of runs (feddb/rows.py: a method's display name and the
switches it differs by, e.g. X-FedDPL, FedDB w/o DMA) and its setting (dataset, partition), and writes:
- results.md: per partition (IID, δ=0.3, δ=0.1) a table of methods × datasets with mean(std) over
  seeds of the final test accuracy and of the test accuracy at the round of best validation
  accuracy (%), as the paper's Tables 1-3, collapsed runs flagged; paired per-seed differences
  (FixMatch − FedAvg, X-FedDPL − X, FedDB − FixMatch-FedDPL, ...) with a 95 % interval; the
  accuracy of confident pseudo-labels per method; the DPL/DMA ablation of FedDB's FixMatch client
  (Table 4); results.csv: the numbers, one line per cell; runs.csv: every run it read, with its
  commit and run-config (what `feddb reproduce` re-runs);
- when the runs span several server strategies (`strategy=`): strategies × the clients' methods,
  final accuracy and paired differences from Flower's FedAvg, and strategies.png;
- convergence.png, class_accuracy.png, pseudo_labels.png, js_divergence.png, dma_weights.png;
- label_distribution_<dataset>_<partition>.png: per setting, the class counts of each client's
  labeled and unlabeled data, copied from the setting's first seed's run (every method of a seed
  shares its partition).
Each method keeps one colour in every figure (X-FedDPL: the light shade of X's, dashed).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import shutil
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from feddb.plan import PlanError, headline, read_plan
from feddb.rows import comparisons, display_order, table, variant_name
from feddb.stats import fisher, holm, interval95, p_text, paired_test, split
from fssl import identity
from fssl.checks import ConfigError
from fssl.methods import method_class
from fssl.methods.fixmatch import FixMatch
from fssl.pairing import pairable
from fssl.partition import label_figure_title, plot_label_distribution, scenario_of
from fssl.record import RoundMetrics, parse_rounds, run_summary
from server_app.rounds import FAILURE
from strategy.flower import FLOWER

STRATEGY_NAMES = {"method": "the method's own (project)", **FLOWER}


def strategy_label(cfg: dict[str, Any]) -> str:
    """The server strategy of a run (`strategy=`): the project's own, Flower's, or a user's."""
    s = cfg.get("strategy") or {"name": "method"}
    return (
        f"custom {s.get('target')}"
        if s["name"] == "custom"
        else STRATEGY_NAMES.get(s["name"], s["name"])
    )


def variant(cfg: dict[str, Any]) -> str:
    """The paper's row name of a run: the method, '-FedDPL' when DPL is added, and the switches
    that differ from the method's defaults otherwise (e.g. 'FedDB w/o DMA', 'FixMatch+DMA');
    ' @ <strategy>' when the server runs another strategy than the method's own."""
    name = local_variant(cfg)
    if (cfg.get("strategy") or {}).get("name", "method") != "method":
        name += f" @ {strategy_label(cfg)}"
    return name


def local_variant(cfg: dict[str, Any]) -> str:
    """The row name without the server strategy: the clients' method and switches."""
    m = cfg["method"]
    name = variant_name(m, bool(cfg["dpl"]), bool(cfg["dma"]["enabled"]), prior_of(cfg))
    if m.get("static_bn") and cfg["model"]["norm"] == "bn":  # SemiFL as published: its own row
        name += " (static BN)"
    return name


def prior_of(cfg: dict[str, Any]) -> str:
    return cfg.get("dpl_prior", "local")  # runs saved before it: local


DATASETS = {"cifar10": "CIFAR10", "svhn": "SVHN", "cifar100": "CIFAR100", "mnist10k": "MNIST-10k"}


def partition_label(cfg: dict[str, Any]) -> str:
    """'IID', 'δ=0.3', or a Flower Datasets partitioner with its parameters, without spaces:
    'Pathological(num_classes_per_partition=2)'."""
    p = cfg["partition"]
    if p["mode"] == "flwr":
        params = ",".join(f"{k}={v}" for k, v in (p.get("params") or {}).items())
        return f"{p['partitioner'].removesuffix('Partitioner')}({params})".replace(" ", "")
    return "IID" if p["mode"] == "iid" else f"δ={p['delta']}"


# where the labels live, in a setting's name ("mnist10k δ=0.3/labels-at-server"); the paper's
# scenario, labels at the clients, is left unnamed
SCENARIO_LABELS = {
    "labels_at_clients": "",
    "labels_at_server": "labels-at-server",
    "labels_at_partial_clients": "labels-at-partial-clients",
}


def placed_partition(cfg: dict[str, Any]) -> str:
    """The partition and, outside the paper's scenario, where the labels live: 'δ=0.3',
    'δ=0.3/labels-at-server'. Each gets its own tables."""
    scenario = SCENARIO_LABELS[scenario_of(cfg)[0]]
    return partition_label(cfg) + (f"/{scenario}" if scenario else "")


def setting(cfg: dict[str, Any]) -> str:
    return f"{cfg['dataset']['name']} {placed_partition(cfg)}"


def partition_rank(part: str) -> tuple[int, float, str, int]:
    """The paper's order: IID, then decreasing delta, then Flower Datasets' partitioners by name;
    within each, labels at the clients, at the server, at some clients."""
    part, _, scenario = part.partition("/")
    where = list(SCENARIO_LABELS.values()).index(scenario)
    if part == "IID":
        return 0, 0.0, "", where
    if part.startswith("δ="):
        return 1, -float(part[2:]), "", where
    return 2, 0.0, part, where


def dataset_rank(name: str) -> tuple[int, str]:
    """The paper's column order (CIFAR10, SVHN, CIFAR100), then any other dataset by name."""
    known = list(DATASETS)
    return known.index(name) if name in known else len(known), name


def partition_order(parts) -> list[str]:
    return sorted(set(parts), key=partition_rank)


def dataset_order(names) -> list[str]:
    return sorted(set(names), key=dataset_rank)


def setting_order(settings) -> list[str]:
    """Per dataset (paper order), IID then decreasing delta."""

    def key(s: str):
        name, _, part = s.rpartition(" ")
        return dataset_rank(name), partition_rank(part)

    return sorted(set(settings), key=key)


def fixmatch_client(trainer: Any) -> bool:
    """FixMatch's client as it is: FixMatch, or a class that only names it anew (FedDB adds DPL
    and DMA through the configuration, not through a method of its own)."""
    try:
        cls = method_class(trainer)
    except ConfigError:
        return False
    if FixMatch not in cls.__mro__:
        return False
    line = cls.__mro__[: cls.__mro__.index(FixMatch)]
    return not any(callable(v) for c in line for k, v in vars(c).items() if not k.startswith("_"))


def ablation_key(cfg: dict[str, Any]) -> tuple[bool, bool] | None:
    """(DPL, DMA) for runs of FedDB's client (FixMatch, pseudo-labels once per round, averaging)."""
    m = cfg["method"]
    if (
        prior_of(cfg) != "local"  # the paper's DPL divides by the local prior
        or not fixmatch_client(m.get("trainer"))
        or m.get("strategy", "fedavg") != "fedavg"
        or m.get("pseudo_labels", "round") != "round"
    ):
        return None
    return bool(cfg["dpl"]), bool(cfg["dma"]["enabled"])


SET_ASIDE = (".interrupted", ".failed")  # a partial run a sweep started again (feddb.sweep)


def load_runs(paths: list[Path], left_out: list[str] | None = None) -> list[dict[str, Any]]:
    """The finished runs below `paths`, each named by its identity (fssl/identity.py). Every other
    run directory is left out with one line in `left_out`: failed, unfinished, set aside by a
    sweep, or unreadable (the line names the file)."""
    left_out = [] if left_out is None else left_out
    runs = []
    for root in paths:
        for cfg_file in sorted(root.rglob("config.yaml")):
            run_dir = cfg_file.parent
            if run_dir.name == ".hydra":  # Hydra's record of a sweep's launch, not a run
                continue
            try:
                run, why = read_run(run_dir)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                run, why = None, f"unreadable ({type(err).__name__}: {str(err)[:120]})"
            if run is None:
                left_out.append(f"{run_dir}: {why}")
            else:
                runs.append(run)
    return runs


def read_run(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """A finished run's record, or None and why it is left out."""
    if any(part.endswith(SET_ASIDE) for part in run_dir.parts):
        return None, "set aside by a sweep that ran it again"
    if (run_dir / FAILURE).is_file():
        return None, f"failed ({FAILURE})"
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None, "unfinished (no metrics.jsonl)"
    cfg = read_file(run_dir / "config.yaml", yaml.safe_load)
    rounds = read_file(metrics, parse_rounds)
    if not rounds or rounds[-1].round < cfg["num_rounds"]:
        done = rounds[-1].round if rounds else 0
        return None, f"unfinished (round {done} of {cfg['num_rounds']})"
    ident = identity.read(run_dir) or recovered(run_dir, cfg)
    summary = run_summary(rounds)
    made = [x for x in rounds if x.pseudo_label_accuracy_pooled is not None]
    pooled = [x.pseudo_label_accuracy_pooled for x in made]  # rounds that made pseudo-labels
    return {
        "dir": run_dir,
        "cfg": cfg,
        "identity": ident,
        "rounds": rounds,
        "variant": shown_name(ident, cfg),
        "local": local_variant(cfg),
        "strategy": strategy_label(cfg),
        "setting": setting(cfg),
        "dataset": cfg["dataset"]["name"],
        "partition": placed_partition(cfg),
        "seed": cfg["seed"],
        "best": summary["best_test_accuracy"],
        "final": summary["final_test_accuracy"],
        # test accuracy at the best-validation round (final if no validation)
        "selected": summary["selected_test_accuracy"]
        if summary["selected_test_accuracy"] is not None
        else summary["final_test_accuracy"],
        "collapsed": summary["collapsed"],
        "max_top_class_share": summary["max_top_class_share_late"],
        "pl_accuracy": float(np.mean(pooled)) if pooled else None,
        "pl_ratio": float(np.mean([x.pseudo_label_ratio or 0.0 for x in made])) if made else None,
        "method_metrics": method_metrics(rounds),
        "few_labeled": few_labeled(cfg, rounds),
        "provenance": read_file(prov, json.loads)
        if (prov := run_dir / "provenance.json").is_file()
        else {},
    }, ""


def read_file(path: Path, parse):
    """A run's file parsed; ValueError naming the file when it cannot be."""
    try:
        return parse(path.read_text())
    except (ValueError, yaml.YAMLError) as err:
        raise ValueError(f"{path.name}: {str(err).splitlines()[0][:100]}") from None


def recovered(run_dir: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """The identity of a run from before identities were recorded: named by its switches as the
    report named it then (variant), its fingerprint from its saved configuration."""
    rc_file = run_dir / "run_config.json"
    rc = json.loads(rc_file.read_text()) if rc_file.is_file() else {}
    return {
        "row": variant(cfg),
        "row_from": "switches",
        "selection": None,
        "regime": rc.get("experiment", ""),
        "config": identity.config_fingerprint(cfg),
        "dataset": rc.get("dataset", cfg["dataset"]["name"]),
        "partition": rc.get("partition", ""),
    }


def shown_name(ident: dict[str, Any], cfg: dict[str, Any]) -> str:
    """A run's name in the tables: its row's display name (a row of the table), else the name
    of its switches as the report builds it; a selection's key and value after it."""
    row = table().get(ident["row"]) if ident.get("row_from") == "table" else None
    name = row.display if row else variant(cfg)
    sel = ident.get("selection")
    return f"{name} ({sel['key']}={sel['value']})" if sel else name


def check_groups(runs: list[dict[str, Any]], apart: bool) -> str | None:
    """Each table cell is one run per seed of one configuration. Why not (a seed twice, runs of
    one name with other settings: the keys named), or None; with `split`, runs of one name and
    other settings become cells of their own (`apart`), named by the keys that differ."""
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        cells[(r["setting"], r["variant"])].append(r)
    for (sett, name), rs in cells.items():
        first, prints = rs[0], {r["identity"]["config"] for r in rs}
        keys = sorted(
            {k for r in rs[1:] for k in identity.differing_keys(first["cfg"], r["cfg"])}
            if len(prints) > 1
            else ()
        )
        if keys and apart:
            for r in rs:
                values = ", ".join(f"{k}={lookup_key(r['cfg'], k)}" for k in keys)
                r["variant"] = f"{name} {{{values}}}"
            continue
        if keys:
            return (
                f"{name} @ {sett}: its runs differ in {', '.join(keys)} ({first['dir']} and "
                "others); report them apart (--split), or give directories of one configuration"
            )
        seeds = [r["seed"] for r in rs]
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        if twice:
            dirs = [str(r["dir"]) for r in rs if r["seed"] == twice[0]]
            return (
                f"{name} @ {sett}: seed {twice[0]} twice ({' and '.join(dirs)}); give one of them"
            )
    return check_groups(runs, False) if apart else None  # the split cells: a seed twice?


def lookup_key(cfg: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def method_metrics(rounds: list[RoundMetrics]) -> dict[str, float]:
    """A method's own figures (LocalTrainer.client_metrics) in the last round that trained
    clients: each one's mean over those clients."""
    last = next((r.clients for r in reversed(rounds) if r.clients), [])
    values: dict[str, list[float]] = defaultdict(list)
    for client in last:
        for name, value in (client.get("method") or {}).items():
            if value is not None:
                values[name].append(float(value))
    return {name: float(np.mean(v)) for name, v in sorted(values.items())}


def few_labeled(cfg: dict[str, Any], rounds: list[RoundMetrics]) -> dict[str, float] | None:
    """With the labels at a few clients: the labeled clients' summed aggregation weight, mean
    over the semi-supervised rounds (a round that sampled none of them counts 0), and the final
    model's worst class; None in the other scenarios."""
    if scenario_of(cfg)[0] != "labels_at_partial_clients":
        return None
    semi = [r for r in rounds if r.round > cfg["train"]["warmup_rounds"] and r.clients]
    shares = [sum(c["weight"] for c in r.clients if c.get("num_labeled")) for r in semi]
    last = next((r.scores.class_accuracy for r in reversed(rounds) if r.scores.class_accuracy), [])
    return {
        "labeled_weight": float(np.mean(shares)) if shares else float("nan"),
        "worst_class": min(last) if last else float("nan"),
    }


def few_labeled_section(runs: list[dict[str, Any]]) -> list[str]:
    """Per setting and method, over seeds: the labeled clients' weight and the worst class
    (labels_at_partial_clients runs only)."""
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        if r.get("few_labeled"):
            cells[(r["setting"], r["variant"])].append(r["few_labeled"])
    if not cells:
        return []
    out = [
        "### The labels at a few clients: the labeled clients' weight and the worst class",
        "",
        "| setting | method | labeled clients' summed weight, % (mean over the semi-supervised "
        "rounds) | worst class at the end, % | seeds |",
        "|---|---|---|---|---|",
    ]
    for (sett, var), got in sorted(
        cells.items(), key=lambda kv: (kv[0][0], variant_rank(kv[0][1]))
    ):
        weight, worst = ([g[k] for g in got] for k in ("labeled_weight", "worst_class"))
        out.append(f"| {sett} | {var} | {fmt(weight)} | {fmt(worst)} | {len(got)} |")
    return [*out, ""]


def method_section(runs: list[dict[str, Any]]) -> list[str]:
    """The methods' own figures, per setting and method: mean over seeds of each run's last
    round (mean over its clients)."""
    cells: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        for name, value in r.get("method_metrics", {}).items():
            cells[(r["setting"], r["variant"])][name].append(value)
    if not cells:
        return []
    out = [
        "### The methods' own figures (last round: mean over its clients; mean over seeds)",
        "",
        "| setting | method | figure | value | seeds |",
        "|---|---|---|---|---|",
    ]
    for (sett, var), figures in sorted(
        cells.items(), key=lambda kv: (kv[0][0], variant_rank(kv[0][1]))
    ):
        for name, values in figures.items():
            out.append(f"| {sett} | {var} | {name} | {np.mean(values):.4g} | {len(values)} |")
    return [*out, ""]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for a single value)."""
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else float("nan")


def fmt(values: list[float], collapsed: int = 0) -> str:
    """The paper's mean(std) in %; '–' for no runs, '(–)' for one seed, '†n' when n of the runs
    ended collapsed (one class for over half of the test set)."""
    if not values:
        return "–"
    m, s = mean_std([100 * v for v in values])
    return f"{m:.2f}({'–' if math.isnan(s) else f'{s:.2f}'})" + (
        f" †{collapsed}" if collapsed else ""
    )


def paired(
    runs: list[dict[str, Any]],
    key: str = "final",
    left_out: list[str] | None = None,
    family: list[tuple[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Per setting, per comparison (a plan's `family`, else the table of runs' own, feddb/rows.py:
    `comparisons`): the per-seed differences of `key` on the seeds whose runs are a pair
    (fssl/pairing.py); each other seed's goes to `left_out` as one line saying why."""
    left_out = [] if left_out is None else left_out
    by: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for r in runs:
        by[(r["setting"], r["variant"])].setdefault(r["seed"], r)
    pairs, out = family or comparisons(v for _, v in by), []
    for sett in setting_order(s for s, _ in by):
        for a, b in pairs:
            ra, rb = by.get((sett, a), {}), by.get((sett, b), {})
            why = {s: pairable(ra[s], rb[s]) for s in sorted(set(ra) & set(rb))}
            left_out += [f"{sett}, {a} − {b}, seed {s}: {w}" for s, w in why.items() if w]
            both = [s for s, w in why.items() if not w and None not in (ra[s][key], rb[s][key])]
            if not both:
                continue
            diffs = [100 * (ra[s][key] - rb[s][key]) for s in both]
            m, lo, hi = interval95(diffs)
            out.append(
                {
                    "setting": sett,
                    "a": a,
                    "b": b,
                    "seeds": len(both),
                    "diffs": diffs,
                    "mean": m,
                    "low": lo,
                    "high": hi,
                    "collapsed": (
                        sum(bool(ra[s]["collapsed"]) for s in both),
                        sum(bool(rb[s]["collapsed"]) for s in both),
                    ),
                }
            )
    return out


def paired_table(rows: list[dict[str, Any]], what: str) -> list[str]:
    """The table's comparisons are one family: each row's paired t p-value and Holm's adjustment
    over the rows, beside the raw interval (an interval clear of 0 need not survive the
    correction) and the exact sign test. Where the two arms' runs split into collapsed and not,
    the difference is bimodal: the collapse counts are compared instead (Fisher's exact test),
    and that p-value is the one Holm's family takes."""
    tests = [paired_test(p["diffs"]) for p in rows]
    counts = [(*p.get("collapsed", (0, 0)), p["seeds"]) for p in rows]
    on_counts = [split(ca, n, cb, n) for ca, cb, n in counts]
    raw = [
        fisher(ca, n, cb, n) if by_count else t["p"]
        for (ca, cb, n), by_count, t in zip(counts, on_counts, tests)
    ]
    out = [
        f"| setting | comparison | seeds | per-seed differences | mean | 95 % interval | p | "
        f"p, Holm over the table | sign test p | collapsed runs (Fisher p) | {what} |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p, t, p_raw, p_holm, (ca, cb, n), by_count in zip(
        rows, tests, raw, holm(raw), counts, on_counts
    ):
        ci = "–" if math.isnan(p["low"]) else f"[{p['low']:+.2f}, {p['high']:+.2f}]"
        verdict = (
            "–"
            if math.isnan(p["low"])
            else "above 0"
            if p["low"] > 0
            else "below 0"
            if p["high"] < 0
            else "includes 0"
        )
        collapse = f"{ca} of {n}; {cb} of {n}" + (f" ({p_text(p_raw)})" if by_count else "")
        out.append(
            f"| {p['setting']} | {p['a']} − {p['b']} | {p['seeds']} | "
            + " ".join(f"{d:+.2f}" for d in p["diffs"])
            + f" | {p['mean']:+.2f} | {ci} | {p_text(t['p'])} | {p_text(p_holm)} | "
            f"{p_text(t['p_sign'])} | {collapse} | {verdict} |"
        )
    return out


# a plan's endpoint (feddb/plan.py) -> the run's figure it names
ENDPOINTS = {
    "final test accuracy": "final",
    "test accuracy at the best-validation round": "selected",
}


def paired_section(
    runs: list[dict[str, Any]], dropped: list[str], plan: dict[str, Any] | None
) -> list[str]:
    """The paired differences: the table's own comparisons, or the plan's family on its
    endpoint under the plan's line (its file, commit, test and alpha)."""
    if plan is None:
        pairs, title, head = paired(runs, left_out=dropped), "final test accuracy", []
    else:
        key, title = ENDPOINTS[plan["endpoint"]], plan["endpoint"]
        pairs = paired(runs, key, dropped, plan["family"])
        head = [plan["headline"], ""]
    if not pairs:
        return []
    return [
        f"### Paired per-seed differences of {title} (points)",
        "",
        *head,
        *paired_table(pairs, "the interval is"),
        "",
    ]


def plan_problem(plan: dict[str, Any], runs: list[dict[str, Any]]) -> str | None:
    """Why a plan cannot judge these runs: an endpoint the report does not compute, or a row its
    family names that none of the runs is (a typo would drop its comparisons unseen)."""
    if plan["endpoint"] not in ENDPOINTS:
        return f"the plan's endpoint {plan['endpoint']!r}: choose {' or '.join(ENDPOINTS)}"
    shown = {r["variant"] for r in runs}
    absent = sorted({name for pair in plan["family"] for name in pair} - shown)
    if absent:
        return (
            f"the plan's family names {', '.join(absent)}, not among these runs' rows "
            f"({', '.join(sorted(shown))}): give their run directories or fix the plan"
        )
    return None


def variant_rank(name: str) -> tuple[int, str]:
    order = display_order()
    return order.index(name) if name in order else len(order), name


def variant_order(names) -> list[str]:
    return sorted(set(names), key=variant_rank)


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (setting, variant): best and final accuracy over seeds."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["setting"], r["variant"])].append(r)
    rows = []
    for (sett, var), rs in groups.items():
        rows.append(
            {
                "setting": sett,
                "variant": var,
                "dataset": rs[0]["dataset"],
                "partition": rs[0]["partition"],
                "seeds": sorted(r["seed"] for r in rs),
                "collapsed": sum(r["collapsed"] for r in rs),
                "max_top_class_share": max((r["max_top_class_share"] or 0) for r in rs),
                "pl_accuracy": [r["pl_accuracy"] for r in rs if r["pl_accuracy"] is not None],
                "pl_ratio": [r["pl_ratio"] for r in rs if r["pl_ratio"] is not None],
                "best": [r["best"] for r in rs],
                "final": [r["final"] for r in rs],
                "selected": [r["selected"] for r in rs],
            }
        )
    return rows


def markdown(
    runs: list[dict[str, Any]], rows: list[dict[str, Any]], plan: dict[str, Any] | None = None
) -> str:
    """The paper's layout: per partition one table, methods down, datasets across, mean(std) over
    seeds; then the paired differences (a plan's family, its endpoint and its line, where given)
    and the ablation, partitions stacked as in the paper's Table 4."""
    parts = partition_order(r["partition"] for r in rows)
    datasets = dataset_order(r["dataset"] for r in rows)
    head = " | ".join(DATASETS.get(d, d) for d in datasets)
    cell = {(r["partition"], r["dataset"], r["variant"]): r for r in rows}
    out = []
    for key, title in (
        ("final", "Final test accuracy"),
        ("selected", "Test accuracy at the best-validation round"),
    ):
        for part in parts:
            out += [
                f"### {title} (%), {part}: mean(std) over seeds",
                "",
                f"| method | {head} |",
                "|---" * (len(datasets) + 1) + "|",
            ]
            for var in variant_order(r["variant"] for r in rows if r["partition"] == part):
                vals = [
                    fmt(c[key], c["collapsed"] if key == "final" else 0)
                    if (c := cell.get((part, d, var)))
                    else "–"
                    for d in datasets
                ]
                out.append(f"| {var} | " + " | ".join(vals) + " |")
            out.append("")
    out += [
        seed_note(rows) + " †n: n runs ended collapsed (one class predicted for more than "
        "half of the test set).",
        "",
    ]
    dropped: list[str] = []
    out += paired_section(runs, dropped, plan)
    out += [f"Pairs left out: {'; '.join(dropped)}.", ""] if dropped else []
    semi = [r for r in rows if r["pl_accuracy"]]
    if semi:
        out += [
            "### Confident pseudo-labels and the collapse signal",
            "",
            "| setting | method | confident pseudo-labels correct, % (mean over rounds) | "
            "pseudo-label ratio, % (same rounds) | largest top-class share of test "
            "predictions, second half of the rounds | collapsed runs |",
            "|---|---|---|---|---|---|",
        ]
        for r in sorted(semi, key=lambda r: (r["setting"], variant_rank(r["variant"]))):
            out.append(
                f"| {r['setting']} | {r['variant']} | {fmt(r['pl_accuracy'])} | "
                f"{fmt(r['pl_ratio'])} | "
                f"{r['max_top_class_share']:.2f} | {r['collapsed']} of {len(r['seeds'])} |"
            )
        pl_pairs = [
            p
            for p in paired([r for r in runs if r["pl_accuracy"] is not None], "pl_accuracy")
            if p["a"].endswith("-FedDPL") or p["a"] == "FedDB"
        ]
        if pl_pairs:
            out += ["", "Paired differences of confident pseudo-label accuracy (points):", ""]
            out += paired_table(pl_pairs, "the interval is")
        out.append("")
    out += method_section(runs)
    out += few_labeled_section(runs)
    out += strategy_section(runs)
    abl = ablation(runs)
    if abl:
        out += [
            "### Ablation: DPL and DMA on FedDB's client, final test accuracy (%)",
            "",
            f"| partition | DPL | DMA | {head} |",
            "|---|---|---" + "|---" * len(datasets) + "|",
        ]
        mark = lambda b: "✓" if b else "–"  # noqa: E731
        for part in parts:
            for k in [(False, False), (True, False), (True, True), (False, True)]:
                if any((part, d, k) in abl for d in datasets):
                    out.append(
                        f"| {part} | {mark(k[0])} | {mark(k[1])} | "
                        + " | ".join(fmt(abl.get((part, d, k), [])) for d in datasets)
                        + " |"
                    )
        out += ["", "(DPL without DMA is FixMatch-FedDPL; a seed run both ways counts once.)", ""]
    return "\n".join(out)


REFERENCE_STRATEGY = "FedAvg"


def strategy_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of a strategy comparison (empty unless more than one strategy is present)."""
    return runs if len({r["strategy"] for r in runs}) > 1 else []


def strategy_order(names) -> list[str]:
    order = list(STRATEGY_NAMES.values())
    return sorted(set(names), key=lambda n: (order.index(n) if n in order else len(order), n))


def strategy_section(runs: list[dict[str, Any]]) -> list[str]:
    """Strategies down, the clients' methods across: final accuracy mean(std) over seeds (†n
    collapsed), then each strategy's paired per-seed difference from Flower's FedAvg on the same
    clients, setting and seeds."""
    runs = strategy_runs(runs)
    if not runs:
        return []
    out = []
    for sett in setting_order({r["setting"] for r in runs}):
        rs = [r for r in runs if r["setting"] == sett]
        locals_ = variant_order(r["local"] for r in rs)
        cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for r in rs:
            cells[(r["strategy"], r["local"])].append(r)
        out += [
            f"### Strategies, {sett}: final test accuracy (%), mean(std) over seeds",
            "",
            "| server strategy | " + " | ".join(locals_) + " |",
            "|---" * (len(locals_) + 1) + "|",
        ]
        for strat in strategy_order(r["strategy"] for r in rs):
            vals = []
            for loc in locals_:
                c = cells.get((strat, loc), [])
                vals.append(
                    fmt([r["final"] for r in c], sum(r["collapsed"] for r in c))
                    + (f" ({len(c)})" if c else "")
                )
            out.append(f"| {strat} | " + " | ".join(vals) + " |")
        out += ["", "(n) = seeds. †n: n runs ended collapsed.", ""]
        diffs = []
        for loc in locals_:
            ref = {r["seed"]: r for r in cells.get((REFERENCE_STRATEGY, loc), [])}
            for strat in strategy_order(r["strategy"] for r in rs):
                if strat == REFERENCE_STRATEGY:
                    continue
                mine = {r["seed"]: r for r in cells.get((strat, loc), [])}
                seeds = sorted(set(ref) & set(mine))
                if not seeds:
                    continue
                d = [100 * (mine[k]["final"] - ref[k]["final"]) for k in seeds]
                m, lo, hi = interval95(d)
                diffs.append(
                    {
                        "setting": sett,
                        "a": f"{loc} @ {strat}",
                        "b": f"{loc} @ {REFERENCE_STRATEGY}",
                        "seeds": len(d),
                        "diffs": d,
                        "mean": m,
                        "low": lo,
                        "high": hi,
                    }
                )
        if diffs:
            out += [
                f"Paired per-seed differences of final test accuracy from Flower's "
                f"{REFERENCE_STRATEGY} on the same clients (points):",
                "",
                *paired_table(diffs, "the interval is"),
                "",
            ]
    return out


def strategy_figure(runs: list[dict[str, Any]], out: Path, plt) -> Path | None:
    """Final accuracy per strategy (bars: mean over seeds, dots: seeds, x: collapsed runs), one
    bar per clients' method, one panel per setting."""
    runs = strategy_runs(runs)
    if not runs:
        return None
    settings = setting_order({r["setting"] for r in runs})
    fig, axes = _grid(
        len(settings),
        plt,
        width=7.0,
        height=0.45 * len({r["strategy"] for r in runs}) * max(1, len({r["local"] for r in runs}))
        + 1.5,
    )
    for ax, sett in zip(axes, settings):
        rs = [r for r in runs if r["setting"] == sett]
        strats = strategy_order(r["strategy"] for r in rs)
        locals_ = variant_order(r["local"] for r in rs)
        col = colours(locals_)
        h = 0.8 / len(locals_)
        for j, loc in enumerate(locals_):
            for i, strat in enumerate(strats):
                vals = [r for r in rs if r["strategy"] == strat and r["local"] == loc]
                if not vals:
                    continue
                y = i + (j - (len(locals_) - 1) / 2) * h
                acc = [100 * r["final"] for r in vals]
                ax.barh(
                    y,
                    float(np.mean(acc)),
                    height=h * 0.9,
                    color=col[loc],
                    label=loc if i == 0 else None,
                    alpha=0.8,
                )
                ax.scatter(acc, [y] * len(acc), s=10, color="black", zorder=3)
                for r in vals:
                    if r["collapsed"]:
                        ax.scatter([100 * r["final"]], [y], marker="x", s=40, color="red", zorder=4)
        ax.set_yticks(range(len(strats)), strats)
        ax.invert_yaxis()
        lo = min(100 * r["final"] for r in rs)
        ax.set_xlim(max(0.0, lo - 5), 100)
        ax.set_xlabel("final test accuracy (%)")
        ax.set_title(sett)
        ax.grid(axis="x", alpha=0.3)
        _legend(ax)
    text = "Server strategies on the same clients (dots: seeds; x: collapsed)"
    return _save(fig, text, out / "strategies.png", dpi=120)


def seed_note(rows: list[dict[str, Any]]) -> str:
    """Which seeds the cells average, the exceptions listed."""
    counts = defaultdict(list)
    for r in rows:
        counts[tuple(r["seeds"])].append(r)
    common = max(counts, key=lambda k: len(counts[k]))
    text = f"Each cell: seeds {', '.join(map(str, common))} ({len(common)} run" + (
        "s)" if len(common) > 1 else ")"
    )
    others = [
        f"{r['variant']} @ {r['setting']}: seeds {', '.join(map(str, r['seeds']))}"
        for k, rs in counts.items()
        if k != common
        for r in rs
    ]
    return text + ("; except " + "; ".join(sorted(others)) if others else "") + "."


def ablation(runs: list[dict[str, Any]]) -> dict[tuple[str, str, tuple[bool, bool]], list[float]]:
    """Final accuracy per (partition, dataset, (DPL, DMA)) of FedDB's client, one value per seed (the
    same computation under two row names, e.g. FixMatch-FedDPL and FedDB w/o DMA, counts once)."""
    seen: dict[tuple, float] = {}
    for r in sorted(runs, key=lambda r: str(r["dir"])):
        k = ablation_key(r["cfg"])
        if k is not None:
            seen.setdefault((r["partition"], r["dataset"], k, r["seed"]), r["final"])
    out: dict[tuple[str, str, tuple[bool, bool]], list[float]] = defaultdict(list)
    for (part, d, k, _), best in seen.items():
        out[(part, d, k)].append(best)
    return out


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "setting",
                "method",
                "seeds",
                "collapsed",
                "final_mean",
                "final_std",
                "selected_mean",
                "selected_std",
                "best_mean",
                "best_std",
            ]
        )
        settings = setting_order(r["setting"] for r in rows)
        for r in sorted(
            rows, key=lambda r: (settings.index(r["setting"]), variant_rank(r["variant"]))
        ):
            bm, bs = mean_std([100 * v for v in r["best"]])
            fm, fs = mean_std([100 * v for v in r["final"]])
            sm, ss = mean_std([100 * v for v in r["selected"]])
            num = lambda v: "" if math.isnan(v) else f"{v:.4f}"  # noqa: E731
            w.writerow(
                [
                    r["setting"],
                    r["variant"],
                    len(r["seeds"]),
                    r["collapsed"],
                    num(fm),
                    num(fs),
                    num(sm),
                    num(ss),
                    num(bm),
                    num(bs),
                ]
            )


# -- figures ------------------------------------------------------------------------------------

# tab20 index per method (dark shade; X-FedDPL takes the light shade of X's colour, dashed)
HUES = {
    "FixMatch": 0,
    "FedMatch": 2,
    "FedRGD": 4,
    "FedDB": 6,
    "SemiFL": 8,
    "FedDB w/o DMA": 10,
    "FedDB w/o DPL": 12,
    "FedAvg": 14,
}


def colours(variants: list[str]) -> dict[str, Any]:
    """One colour per method in every figure: X and X-FedDPL share a hue (dark and light)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    spare = iter(i for i in [16, 18, 17, 19, 1, 3, 5, 7, 9, 11, 13, 15] * 4)
    out = {}
    for v in variant_order(variants):
        base = v.removesuffix("-FedDPL")
        i = HUES[base] + (base != v) if base in HUES else next(spare)
        out[v] = cmap(i)
    return out


def dashes(variant: str) -> str:
    return "--" if variant.endswith("-FedDPL") else "-"


def series(runs: list[dict], key) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rounds, mean and std over seeds of a per-round value (rounds every run has)."""
    n = min(len(r["rounds"]) for r in runs)
    vals = np.array([[_num(key(x)) for x in r["rounds"][:n]] for r in runs], dtype=float)
    with warnings.catch_warnings():  # all-NaN rounds (e.g. no label passed tau)
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(vals, axis=0) if np.isfinite(vals).any() else np.full(n, np.nan)
        std = np.nanstd(vals, axis=0) if np.isfinite(vals).any() else np.full(n, np.nan)
    return np.array([x.round for x in runs[0]["rounds"][:n]]), mean, std


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else float("nan")


def _grid(n: int, plt, width: float = 5.5, height: float = 4.0, cols: int = 3):
    cols = min(n, cols)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _legend(ax) -> None:
    """Below the axes, so that it never hides data."""
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)


def _save(fig, text: str, path: Path, dpi: int = 110) -> Path:
    """The figure titled `text` (wrapped to its width), written to `path` and closed."""
    import textwrap

    import matplotlib.pyplot as plt

    fig.suptitle(textwrap.fill(text, width=int(fig.get_figwidth() * 11)), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


def trailing_mean(v: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` values at each point (fewer at the start)."""
    if window <= 1:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    n = np.minimum(np.arange(1, len(v) + 1), window)
    return (c[1:] - c[np.arange(1, len(v) + 1) - n]) / n


def curve_figure(
    by: dict[str, dict[str, list[dict]]],
    col: dict[str, Any],
    path: Path,
    panels: list[tuple[str, Any, str]],
    title: str,
    only=None,
    smooth: int = 1,
) -> Path:
    """One panel per (setting, quantity), a setting's quantities side by side: a per-round
    quantity's mean over seeds per variant, ± one std shaded (each a trailing mean over `smooth`
    evaluated rounds); `by`: setting -> variant -> runs."""
    import matplotlib.pyplot as plt

    settings = setting_order(by) if all(" " in s for s in by) else list(by)
    fig, axes = _grid(len(settings) * len(panels), plt, cols=len(panels) if len(panels) > 1 else 3)
    for i, s in enumerate(settings):
        for j, (label, key, ylabel) in enumerate(panels):
            ax = axes[i * len(panels) + j]
            for var in variant_order(by[s]):
                rs = by[s][var]
                if only and not only(rs[0]):
                    continue
                x, m, sd = series(rs, key)
                ok = np.isfinite(m)  # rounds between evaluations (eval.every) are gaps
                if not ok.any():
                    continue
                x, m, sd = x[ok], trailing_mean(m[ok], smooth), trailing_mean(sd[ok], smooth)
                ax.plot(x, m, color=col[var], ls=dashes(var), label=f"{var} (n={len(rs)})", lw=1.5)
                if len(rs) > 1:
                    ax.fill_between(x, m - sd, m + sd, color=col[var], alpha=0.15, lw=0)
            ax.set(title=f"{label}: {s}", xlabel="round", ylabel=ylabel)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                _legend(ax)
    return _save(fig, title, path)


def dma_entropy(x: RoundMetrics) -> float | None:
    """The DMA weights' entropy over log(clients): 1 for uniform averaging."""
    n = len(x.dma["weights"]) if x.dma else 0
    return x.dma["weight_entropy"] / math.log(n) if n > 1 else None


def dma_loss_ratio(x: RoundMetrics) -> float | None:
    return (
        x.dma["loss_weights"] / x.dma["loss_uniform"] if x.dma and x.dma["loss_uniform"] else None
    )


# the curves of `feddb report`: (file, panels (title, value of a round, y label), title, runs drawn)
CURVES = (
    (
        "convergence.png",
        [
            ("test accuracy", lambda x: x.scores.test_accuracy, "accuracy"),
            (
                "collapse signal",
                lambda x: x.scores.top_class_share,
                "share of the most-predicted class",
            ),
        ],
        "Convergence: test accuracy of the global model and the share of its most-predicted "
        "class (mean ± std over seeds; above 0.5 = collapsed)",
        None,
    ),
    (
        "pseudo_labels.png",
        [
            ("pseudo-label accuracy", lambda x: x.pseudo_label_accuracy, "accuracy"),
            ("pseudo-label ratio", lambda x: x.pseudo_label_ratio, "fraction of unlabeled"),
        ],
        "Pseudo-labels: accuracy of the confident labels and their share (mean over clients)",
        lambda r: r["cfg"]["method"]["trainer"] != "supervised",
    ),
    (
        "js_divergence.png",
        [
            ("APP-U vs class accuracy", lambda x: x.js_divergence, "JS divergence (bits)"),
            (
                "labeled prior vs class accuracy",
                lambda x: x.js_divergence_labeled,
                "JS divergence (bits)",
            ),
        ],
        "Estimated vs true bias (paper fig. 3): JS divergence to the normalised class-wise "
        "accuracy",
        None,
    ),
    (
        "dma_weights.png",
        [
            ("weight entropy / log(clients)", dma_entropy, "normalised entropy"),
            ("L(beta) / L(uniform)", dma_loss_ratio, "loss ratio"),
        ],
        "DMA weights over rounds (1 = uniform averaging)",
        lambda r: r["cfg"]["dma"]["enabled"],
    ),
)


def figures(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    col = colours([r["variant"] for r in runs])
    by: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by[r["setting"]][r["variant"]].append(r)
    written = [
        curve_figure(by, col, out / name, panels, title, only)
        for name, panels, title, only in CURVES
    ]
    written.append(class_accuracy_figure(by, col, out / "class_accuracy.png", plt))
    strategies = strategy_figure(runs, out, plt)
    if strategies is not None:
        written.append(strategies)
    return written


def class_accuracy_figure(by: dict[str, dict[str, list[dict]]], col, path: Path, plt) -> Path:
    """Per setting, the final global model's class-wise test accuracy, a bar per variant."""
    settings = setting_order(by)
    fig, axes = _grid(len(settings), plt, width=7.0)
    for ax, s in zip(axes, settings):
        names = variant_order(by[s])
        k = len(by[s][names[0]][0]["rounds"][-1].scores.class_accuracy)
        width = 0.8 / len(names)
        for i, var in enumerate(names):
            acc = np.mean([r["rounds"][-1].scores.class_accuracy for r in by[s][var]], axis=0)
            ax.bar(
                np.arange(k) + (i - (len(names) - 1) / 2) * width,
                acc,
                width,
                color=col[var],
                label=var,
            )
        ax.set(
            title=f"final model: {s}",
            xlabel="class",
            ylabel="test accuracy",
            xticks=range(k),
            ylim=(0, 1.05),
        )
        _legend(ax)
    return _save(fig, "Class-wise test accuracy of the final global model (mean over seeds)", path)


LABEL_FIGURE = "label_distribution.png"  # written with each run by fssl.partition.save_partition


def setting_slug(cfg: dict[str, Any]) -> str:
    """A setting as a file name: 'cifar10_iid', 'mnist10k_dir0.3'."""
    p = cfg["partition"]
    part = {"iid": "iid", "flwr": partition_label(cfg)}.get(p["mode"], f"dir{p['delta']}")
    scenario = SCENARIO_LABELS[scenario_of(cfg)[0]]
    name = f"{cfg['dataset']['name']}_{part}" + (f"_{scenario}" if scenario else "")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def label_distributions(runs: list[dict[str, Any]], out: Path) -> dict[str, str]:
    """Per setting, its first seed's label-distribution figure copied into `out` as
    label_distribution_<setting>.png (drawn from partition_summary.json for a run from before
    the figure; a setting with neither has none). Returns file name -> caption."""
    by: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by[r["setting"]].append(r)
    captions = {}
    for sett in setting_order(by):
        for r in sorted(by[sett], key=lambda r: (r["seed"], str(r["dir"]))):
            dst = out / f"label_distribution_{setting_slug(r['cfg'])}.png"
            summary = r["dir"] / "partition_summary.json"
            if (r["dir"] / LABEL_FIGURE).is_file():
                shutil.copyfile(r["dir"] / LABEL_FIGURE, dst)
            elif summary.is_file():
                s = json.loads(summary.read_text())
                plot_label_distribution(
                    np.asarray(s["labeled"]),
                    np.asarray(s["unlabeled"]),
                    dst,
                    label_figure_title(r["cfg"]),
                )
            else:
                continue
            captions[dst.name] = (
                f"Class counts of each client's labeled and unlabeled data, {sett} "
                f"(the partition of seed {r['seed']}, shared by every method of that seed)"
            )
            break
    return captions


CAPTIONS = {
    "convergence.png": "Test accuracy and the share of the most-predicted class per round",
    "class_accuracy.png": "Class-wise test accuracy of the final global model",
    "pseudo_labels.png": "Accuracy and share of the confident pseudo-labels per round",
    "js_divergence.png": "APP-U against the class-wise accuracy (the paper's Figure 3)",
    "dma_weights.png": "How far DMA's weights are from uniform per round",
    "strategies.png": "Final accuracy per server strategy",
    "classes.png": "The worst class's test accuracy and the largest one-class share of "
    "test predictions per round",
    "figure3.png": "APP-U against the class-wise accuracy (the paper's Figure 3)",
}


def caption(name: str, captions: dict[str, str] | None = None) -> str:
    """A figure's caption: given, named in CAPTIONS, or the claims study's <regime>_<figure>
    (a regime's name may hold underscores: exact_class_classes.png)."""
    if name in (captions or {}):
        return captions[name]
    if name in CAPTIONS:
        return CAPTIONS[name]
    for figure in sorted(CAPTIONS, key=len, reverse=True):
        if name.endswith("_" + figure):
            return f"{name[: -len(figure) - 1]} regime. {CAPTIONS[figure]}"
    return Path(name).stem.replace("_", " ")


def embed(figs: list[Path], captions: dict[str, str] | None = None) -> str:
    """Markdown that shows the figures written beside results.md (`captions`: file name ->
    caption, for figures that CAPTIONS does not name)."""
    lines = ["", "### Figures", ""]
    for p in figs:
        text = caption(p.name, captions)
        lines += [f"{text}:", "", f"![{text}]({p.name})", ""]
    return "\n".join(lines)


def left_out_section(left_out: list[str]) -> str:
    if not left_out:
        return ""
    return "\n## Runs left out\n\n" + "".join(f"- {line}\n" for line in left_out)


def out_problem(out: Path) -> str | None:
    """Why `--out` cannot be the directory the tables go to (a file is on its path), or None."""
    for part in [out, *out.absolute().parents]:
        if part.exists() and not part.is_dir():
            return f"--out {out}: {part} is a file, not a directory; choose a directory"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run directories or directories holding them")
    ap.add_argument("--out", default="reports/latest", help="where to write tables and figures")
    ap.add_argument(
        "--split",
        action="store_true",
        help="runs of one row with other settings: cells of their own, named by the keys that "
        "differ (default: refused, the keys named)",
    )
    ap.add_argument(
        "--plan",
        help="a study's plan fixed before its runs (studies/plans/*.yaml): the paired table is "
        "its family on its endpoint, Holm over that family, and names the plan by its commit",
    )
    args = ap.parse_args(argv)
    try:
        plan = read_plan(Path(args.plan)) if args.plan else None
    except PlanError as err:
        print(f"error: --plan: {err}", file=sys.stderr)
        return 2
    paths = [Path(p) for p in args.paths]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        print(f"error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    if out_problem(Path(args.out)):
        print(f"error: {out_problem(Path(args.out))}", file=sys.stderr)
        return 2
    left_out: list[str] = []
    runs = load_runs(paths, left_out)
    for line in left_out:
        print(f"[report] left out {line}", file=sys.stderr)
    if not runs:
        print(
            f"error: no finished run (config.yaml + metrics.jsonl) below {args.paths}",
            file=sys.stderr,
        )
        return 2
    problem = check_groups(runs, args.split) or (plan and plan_problem(plan, runs))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarise(runs)
    figs = figures(runs, out)
    labels = label_distributions(runs, out)
    figs += [out / name for name in labels]
    if plan:
        plan["headline"] = headline(Path(args.plan), plan)
    text = markdown(runs, rows, plan) + embed(figs, labels) + left_out_section(left_out)
    (out / "results.md").write_text(text)
    write_csv(rows, out / "results.csv")
    from feddb.runlist import write_runs

    write_runs(runs, out / "runs.csv")
    print(text)
    print(
        f"[report] {len(runs)} runs; wrote {out / 'results.md'}, {out / 'results.csv'} and "
        f"{', '.join(p.name for p in figs)} in {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

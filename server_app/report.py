"""Tables and figures from run directories, in the paper's layout.

    python -m server_app.report runs/sweep --out reports/sweep

Reads every run directory below the given paths (a directory with config.yaml and metrics.jsonl),
names each run by its paper row (FedAvg, FixMatch, FedMatch, FedRGD, SemiFL, X-FedDPL, FedDB, and
the DPL/DMA ablation variants) and its setting (dataset, partition), and writes:
- results.md: per setting, mean(std) over seeds of the best and of the final test accuracy (%), and
  the DPL/DMA ablation of FedDB's FixMatch client; results.csv: the same numbers, one line per row;
- convergence.png, class_accuracy.png, pseudo_labels.png, js_divergence.png, dma_weights.png.
Each method keeps one colour in every figure.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

NAMES = {"fedavg": "FedAvg", "fixmatch": "FixMatch", "fedmatch": "FedMatch", "fedrgd": "FedRGD",
         "semifl": "SemiFL", "feddb": "FedDB"}
ORDER = ["FedAvg", "FixMatch", "FedMatch", "FedRGD", "SemiFL", "FixMatch-FedDPL",
         "FedMatch-FedDPL", "FedRGD-FedDPL", "SemiFL-FedDPL", "FedDB"]


def variant(cfg: dict[str, Any]) -> str:
    """The paper's row name of a run: the method, '-FedDPL' when DPL is added, and the switches
    that differ from the method's defaults otherwise (e.g. 'FedDB w/o DMA', 'FixMatch+DMA')."""
    m = cfg["method"]
    name = NAMES.get(m["name"], m["name"])
    dpl, dma = bool(cfg["dpl"]), bool(cfg["dma"]["enabled"])
    if dpl != bool(m["dpl"]):
        name += "-FedDPL" if dpl and m["name"] != "feddb" else (" w/o DPL" if not dpl else "")
    if dma != bool(m["dma"]):
        name += "+DMA" if dma else " w/o DMA"
    return name


def setting(cfg: dict[str, Any]) -> str:
    p = cfg["partition"]
    part = "IID" if p["mode"] == "iid" else f"δ={p['delta']}"
    return f"{cfg['dataset']['name']} {part}"


def setting_order(settings) -> list[str]:
    """The paper's column order: per dataset IID, then decreasing delta."""
    def key(s: str):
        name, _, part = s.rpartition(" ")
        return name, 0 if part == "IID" else 1, -float(part[2:]) if part != "IID" else 0.0
    return sorted(set(settings), key=key)


def ablation_key(cfg: dict[str, Any]) -> tuple[bool, bool] | None:
    """(DPL, DMA) for runs of FedDB's client (FixMatch, pseudo-labels once per round, averaging)."""
    m = cfg["method"]
    if m.get("trainer") != "fixmatch" or m.get("strategy", "fedavg") != "fedavg" or \
            m.get("pseudo_labels", "round") != "round":
        return None
    return bool(cfg["dpl"]), bool(cfg["dma"]["enabled"])


def load_runs(paths: list[Path]) -> list[dict[str, Any]]:
    runs = []
    for root in paths:
        for cfg_file in sorted(root.rglob("config.yaml")):
            run_dir = cfg_file.parent
            metrics = run_dir / "metrics.jsonl"
            if not metrics.is_file():
                continue
            cfg = yaml.safe_load(cfg_file.read_text())
            rounds = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            if not rounds:
                continue
            runs.append({"dir": run_dir, "cfg": cfg, "rounds": rounds, "variant": variant(cfg),
                         "setting": setting(cfg), "seed": cfg["seed"],
                         "complete": rounds[-1]["round"] >= cfg["num_rounds"]})
    return runs


def mean_std(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def fmt(values: list[float]) -> str:
    if not values:
        return "–"
    m, s = mean_std([100 * v for v in values])
    return f"{m:.2f}({s:.2f})"


def variant_order(names) -> list[str]:
    return sorted(set(names), key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (setting, variant): best and final accuracy over seeds."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["setting"], r["variant"])].append(r)
    rows = []
    for (sett, var), rs in groups.items():
        best = [max(x["test_accuracy"] for x in r["rounds"]) for r in rs]
        final = [r["rounds"][-1]["test_accuracy"] for r in rs]
        rows.append({"setting": sett, "variant": var, "seeds": sorted(r["seed"] for r in rs),
                     "complete": all(r["complete"] for r in rs), "best": best, "final": final})
    return rows


def markdown(runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    settings = setting_order(r["setting"] for r in rows)
    cell = {(r["setting"], r["variant"]): r for r in rows}
    out = []
    for key, title in (("best", "Best test accuracy"), ("final", "Final test accuracy")):
        out += [f"### {title} (%), mean(std) over seeds", "",
                "| method | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
        for var in variant_order(r["variant"] for r in rows):
            vals = [fmt(cell[(s, var)][key]) if (s, var) in cell else "–" for s in settings]
            out.append(f"| {var} | " + " | ".join(vals) + " |")
        out.append("")
    seeds = {(r["setting"], r["variant"]): r["seeds"] for r in rows}
    out += ["Seeds per cell: " + "; ".join(f"{v} @ {s}: {len(n)}" for (s, v), n in
                                            sorted(seeds.items())) + ".", ""]
    abl: dict[tuple[str, tuple[bool, bool]], list[float]] = defaultdict(list)
    for r in runs:
        k = ablation_key(r["cfg"])
        if k is not None:
            abl[(r["setting"], k)].append(max(x["test_accuracy"] for x in r["rounds"]))
    if abl:
        out += ["### Ablation: DPL and DMA on FedDB's client, best test accuracy (%)", "",
                "| DPL | DMA | " + " | ".join(settings) + " |", "|---|---" + "|---" * len(settings)
                + "|"]
        for k in [(False, False), (True, False), (True, True), (False, True)]:
            if any((s, k) in abl for s in settings):
                mark = lambda b: "✓" if b else "–"  # noqa: E731
                out.append(f"| {mark(k[0])} | {mark(k[1])} | " +
                           " | ".join(fmt(abl.get((s, k), [])) for s in settings) + " |")
        out.append("")
    return "\n".join(out)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["setting", "method", "seeds", "complete", "best_mean", "best_std",
                    "final_mean", "final_std"])
        for r in sorted(rows, key=lambda r: (r["setting"], variant_order([r["variant"]]))):
            bm, bs = mean_std([100 * v for v in r["best"]])
            fm, fs = mean_std([100 * v for v in r["final"]])
            w.writerow([r["setting"], r["variant"], len(r["seeds"]), r["complete"],
                        f"{bm:.4f}", f"{bs:.4f}", f"{fm:.4f}", f"{fs:.4f}"])


# -- figures ------------------------------------------------------------------------------------

def colours(variants: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(variants) <= 10 else "tab20"]
    return {v: cmap(i % cmap.N) for i, v in enumerate(variant_order(variants))}


def series(runs: list[dict], key) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rounds, mean and std over seeds of a per-round value (rounds every run has)."""
    n = min(len(r["rounds"]) for r in runs)
    vals = np.array([[_num(key(x)) for x in r["rounds"][:n]] for r in runs], dtype=float)
    with warnings.catch_warnings():                 # all-NaN rounds (e.g. no label passed tau)
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(vals, axis=0) if np.isfinite(vals).any() else np.full(n, np.nan)
        std = np.nanstd(vals, axis=0) if np.isfinite(vals).any() else np.full(n, np.nan)
    return np.array([x["round"] for x in runs[0]["rounds"][:n]]), mean, std


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else float("nan")


def _grid(n: int, plt, width: float = 5.5, height: float = 4.0):
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _legend(ax) -> None:
    """Below the axes, so that it never hides data."""
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)


def _title(fig, text: str) -> None:
    """A figure title wrapped to the figure's width."""
    import textwrap

    fig.suptitle(textwrap.fill(text, width=int(fig.get_figwidth() * 11)), fontsize=11)
    fig.tight_layout()


def figures(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    col = colours([r["variant"] for r in runs])
    by: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by[r["setting"]][r["variant"]].append(r)
    settings = setting_order(by)
    written = []

    def curves(name: str, panels: list[tuple[str, Any, str]], title: str, only=None) -> None:
        fig, axes = _grid(len(settings) * len(panels), plt)
        for i, s in enumerate(settings):
            for j, (label, key, ylabel) in enumerate(panels):
                ax = axes[i * len(panels) + j]
                for var in variant_order(by[s]):
                    rs = by[s][var]
                    if only and not only(rs[0]):
                        continue
                    x, m, sd = series(rs, key)
                    if np.isnan(m).all():
                        continue
                    ax.plot(x, m, color=col[var], label=f"{var} (n={len(rs)})", lw=1.5)
                    if len(rs) > 1:
                        ax.fill_between(x, m - sd, m + sd, color=col[var], alpha=0.15, lw=0)
                ax.set(title=f"{label}: {s}", xlabel="round", ylabel=ylabel)
                ax.grid(alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    _legend(ax)
        _title(fig, title)
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(out / name)

    curves("convergence.png", [("test accuracy", lambda x: x["test_accuracy"], "accuracy")],
           "Convergence: test accuracy of the global model (mean ± std over seeds)")
    curves("pseudo_labels.png",
           [("pseudo-label accuracy", lambda x: x.get("pseudo_label_accuracy"), "accuracy"),
            ("pseudo-label ratio", lambda x: x.get("pseudo_label_ratio"), "fraction of unlabeled")],
           "Pseudo-labels: accuracy of the confident labels and their share (mean over clients)",
           only=lambda r: r["cfg"]["method"]["trainer"] != "supervised")
    curves("js_divergence.png",
           [("APP-U vs class accuracy", lambda x: x.get("js_divergence"), "JS divergence (bits)"),
            ("labeled prior vs class accuracy", lambda x: x.get("js_divergence_labeled"),
             "JS divergence (bits)")],
           "Estimated vs true bias (paper fig. 3): JS divergence to the normalised class-wise "
           "accuracy")
    curves("dma_weights.png",
           [("weight entropy / log(clients)",
             lambda x: (x["dma"]["weight_entropy"] / math.log(len(x["dma"]["weights"])))
             if x.get("dma") and len(x["dma"]["weights"]) > 1 else None, "normalised entropy"),
            ("L(beta) / L(uniform)",
             lambda x: (x["dma"]["loss_weights"] / x["dma"]["loss_uniform"])
             if x.get("dma") and x["dma"]["loss_uniform"] else None, "loss ratio")],
           "DMA weights over rounds (1 = uniform averaging)", only=lambda r: r["cfg"]["dma"]["enabled"])

    fig, axes = _grid(len(settings), plt, width=7.0)
    for ax, s in zip(axes, settings):
        names = variant_order(by[s])
        k = len(by[s][names[0]][0]["rounds"][-1]["class_accuracy"])
        width = 0.8 / len(names)
        for i, var in enumerate(names):
            acc = np.mean([r["rounds"][-1]["class_accuracy"] for r in by[s][var]], axis=0)
            ax.bar(np.arange(k) + (i - (len(names) - 1) / 2) * width, acc, width, color=col[var],
                   label=var)
        ax.set(title=f"final model: {s}", xlabel="class", ylabel="test accuracy",
               xticks=range(k), ylim=(0, 1.05))
        _legend(ax)
    _title(fig, "Class-wise test accuracy of the final global model (mean over seeds)")
    fig.savefig(out / "class_accuracy.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    written.append(out / "class_accuracy.png")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run directories or directories holding them")
    ap.add_argument("--out", default="reports/latest", help="where to write tables and figures")
    args = ap.parse_args(argv)
    paths = [Path(p) for p in args.paths]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        print(f"error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    runs = load_runs(paths)
    if not runs:
        print(f"error: no run directories (config.yaml + metrics.jsonl) below {args.paths}",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarise(runs)
    text = markdown(runs, rows)
    (out / "results.md").write_text(text)
    write_csv(rows, out / "results.csv")
    figs = figures(runs, out)
    print(text)
    print(f"[report] {len(runs)} runs; wrote {out / 'results.md'}, {out / 'results.csv'} and "
          f"{', '.join(p.name for p in figs)} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

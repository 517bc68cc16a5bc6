"""Run every row of conf/comparison/paper.yaml on one setting and print a markdown table.

    .venv/bin/python scripts/compare.py --out runs/compare --run-config "seed=0"

Each row is one `python -m server_app.launch` run (a real `flwr run` simulation) into OUT/<row>;
rows whose summary.json exists are skipped, so an interrupted comparison continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[1]
PRESET = PROJECT / "conf" / "comparison" / "paper.yaml"
ABLATION = [("FixMatch", "-", "-"), ("DPL without DMA", "yes", "-"), ("FedDB", "yes", "yes"),
            ("DMA without DPL", "-", "yes")]


def slug(name: str) -> str:
    return name.lower().replace(" ", "-")


def run_rows(rows: dict[str, str], out: Path, extra: str) -> list[str]:
    failed = []
    for name, run_config in rows.items():
        run_dir = out / slug(name)
        if (run_dir / "summary.json").is_file():
            continue
        log = out / f"{slug(name)}.log"
        cmd = [sys.executable, "-m", "server_app.launch", "--run-config",
               f"{run_config} {extra} output-dir='{run_dir}'"]
        print(f"[compare] {name}: {' '.join(cmd[3:])}", flush=True)
        with open(log, "w") as f:
            rc = subprocess.call(cmd, cwd=PROJECT, stdout=f, stderr=subprocess.STDOUT)
        if rc != 0:
            failed.append(name)
            print(f"[compare] {name} failed (exit {rc}), see {log}", flush=True)
    return failed


def summary(out: Path, name: str) -> dict | None:
    file = out / slug(name) / "summary.json"
    return json.loads(file.read_text()) if file.is_file() else None


def pct(s: dict | None, key: str) -> str:
    return f"{100 * s[key]:.1f}" if s and s.get(key) is not None else "n/a"


def tables(preset: dict, out: Path) -> str:
    lines = ["| method | best test acc (%) | final test acc (%) | wall (s) |", "|---|---|---|---|"]
    for name in preset["methods"]:
        s = summary(out, name)
        wall = f"{s['wall_seconds']:.0f}" if s else "n/a"
        lines.append(f"| {name} | {pct(s, 'best_test_accuracy')} | "
                     f"{pct(s, 'final_test_accuracy')} | {wall} |")
    lines += ["", "| DPL | DMA | run | best test acc (%) | final test acc (%) |",
              "|---|---|---|---|---|"]
    for name, dpl, dma in ABLATION:
        s = summary(out, name)
        lines.append(f"| {dpl} | {dma} | {name} | {pct(s, 'best_test_accuracy')} | "
                     f"{pct(s, 'final_test_accuracy')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/compare", help="directory of the run directories")
    ap.add_argument("--run-config", default="", help="run-config applied to every row")
    ap.add_argument("--only", nargs="*", help="row names to run (default: all)")
    args = ap.parse_args()
    preset = yaml.safe_load(PRESET.read_text())
    rows = {**preset["methods"], **preset["ablation"]}
    if args.only:
        unknown = sorted(set(args.only) - set(rows))
        if unknown:
            ap.error(f"unknown rows {unknown}; choose from {', '.join(rows)}")
        rows = {k: rows[k] for k in args.only}
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    failed = run_rows(rows, out, args.run_config)
    print(tables(preset, out))
    if failed:
        print(f"[compare] failed rows: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Sweep throughput: N runs side by side, as `feddb sweep --jobs N` runs them, against one at a
time (N = 1, today's `feddb sweep`), in the same call.

    feddb throughput                                     # miniature runs, N = 1, 2 (2 cores)
    feddb throughput --jobs 1,2,4 --rounds 8 --sweep-runs 43

For each N it starts N in-process runs of the experiment at once (different seeds, each with
cores / N CPU threads, as the sweep gives them), each for `--rounds` rounds, and prints:
- rounds/s: rounds of all N runs per second of wall time, in the steady state (rounds 2 and later);
- start-up: seconds a run spends before its first round (data, partition, model, first evaluation);
- the projected wall time of a sweep of `--sweep-runs` runs of the experiment's full length;
- where a round's time goes (N = the first of --jobs): the clients' training, summed, and the
  ServerApp's phases (aggregation, evaluation, records), medians over the steady rounds.

`--mps` runs the comparison under NVIDIA's Multi-Process Service, so that the N runs' kernels
share the GPU at once rather than time-sliced.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]


def run_batch(
    n: int, rounds: int, experiment: str, method: str, extra: str, out: Path
) -> dict[str, float]:
    """N runs at once; wall time, each run's steady round time and its time before round 2."""
    from fssl.runtime import cores

    threads = str(max(1, cores() // n))
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    procs, dirs = [], []
    start = time.perf_counter()
    for seed in range(n):
        run_dir = out / f"n{n}_s{seed}"
        dirs.append(run_dir)
        rc = (
            f"method='{method}' experiment='{experiment}' seed={seed} "
            f"num-server-rounds={rounds} output-dir='{run_dir}' "
            f"overrides='logging.tensorboard=false {extra}'"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "feddb.inprocess", "--run-config", rc],
                cwd=PROJECT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"feddb throughput: a run failed:\n{err[-2000:]}")
    wall = time.perf_counter() - start
    steady, startup, steady_records = [], [], []
    for run_dir in dirs:
        records = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        rounds_s = [r["round_seconds"] for r in records]
        total = json.loads((run_dir / "summary.json").read_text())["wall_seconds"]
        steady.append(statistics.median(rounds_s[1:] or rounds_s))
        startup.append(max(0.0, total - sum(rounds_s)))
        steady_records += records[1:] or records
    return {
        "wall_seconds": wall,
        "round_seconds": statistics.mean(steady),
        "startup_seconds": statistics.mean(startup),
        "phases": round_phases(steady_records),  # the steady rounds of all N runs
    }


def round_phases(records: list[dict]) -> dict[str, float]:
    """Median seconds per steady round: the round, the clients' training (summed over the round's
    clients, and the slowest one), and each phase the ServerApp times."""

    def median(values) -> float:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else 0.0

    def train(r: dict) -> list[float]:
        return [c.get("train_seconds") or 0.0 for c in r.get("clients") or []]

    phases = {
        "round": median(r["round_seconds"] for r in records),
        "clients_training_summed": median(sum(train(r)) for r in records),
        "slowest_client_training": median(max(train(r), default=0.0) for r in records),
    }
    keys = sorted({k for r in records for k in (r.get("timing") or {})})
    for key in keys:
        phases[f"server_{key}"] = median((r.get("timing") or {}).get(key) for r in records)
    return phases


def projected_sweep_seconds(m: dict[str, float], n: int, runs: int, full_rounds: int) -> float:
    """ceil(runs / N) batches, each a run's start-up and its full rounds at the measured speed."""
    return math.ceil(runs / n) * (m["startup_seconds"] + full_rounds * m["round_seconds"])


def table(results: dict, sweep_runs: int, full_rounds: int, mps: dict | None = None) -> str:
    """N runs at once -> rounds/s, a round's share of the wall clock and the projected sweep, as
    markdown (printed, and rendered into docs/speed.md by `feddb tables` from the --out files:
    `mps`, where given, is a second measurement's results under MPS, shown beside)."""
    mps = mps or {}
    head = "| runs at once | rounds/s | seconds a round |"
    if mps:
        head += " with MPS: rounds/s | seconds a round |"
    lines = [head + f" {sweep_runs} runs of {full_rounds} rounds |", "|---" * head.count("|") + "|"]
    for n in sorted({*results, *mps}, key=int):
        cells = [str(n)]
        for m in (results.get(n), *((mps.get(n),) if mps else ())):
            cells += (
                [f"{m['rounds_per_second']:.2f}", f"{1 / m['rounds_per_second']:.2f}"]
                if m
                else ["", ""]
            )
        best = mps.get(n) or results[n]
        hours = best["projected_sweep_seconds"] / 3600
        cells.append(f"{hours:.1f} h" + (" (MPS)" if n in mps else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def docs_table(measured: dict, under_mps: dict | None = None) -> str:
    """`table` of one --out file, with a second one's runs under MPS beside it (`feddb tables`)."""
    cfg = measured["config"]
    if "full_rounds" in cfg:
        full = cfg["full_rounds"]
    else:  # files written before they recorded it
        from server_app.config import compose

        full = compose([f"experiment={cfg['experiment']}"])["num_rounds"]
    mps = under_mps["results"] if under_mps else None
    return table(measured["results"], cfg["sweep_runs"], full, mps=mps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feddb throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--jobs", default="1,2", help="concurrent runs to compare (default 1,2)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds each run trains (default 6)")
    ap.add_argument("--experiment", default="miniature", help="conf/experiment/ preset")
    ap.add_argument("--method", default="feddb", help="the method every run trains")
    ap.add_argument(
        "--sweep-runs", type=int, default=43, help="runs of the projected sweep (miniature: 43)"
    )
    ap.add_argument("--overrides", default="", help="Hydra overrides for every run")
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument(
        "--mps", action="store_true", help="under NVIDIA's Multi-Process Service (a GPU)"
    )
    args = ap.parse_args(argv)
    try:
        jobs = [int(j) for j in args.jobs.split(",")]
    except ValueError:
        ap.error(f"--jobs takes numbers separated by commas, e.g. 1,2,4, not '{args.jobs}'")
    if args.rounds < 2 or min(jobs) < 1:
        ap.error("--rounds must be >= 2 (the first round is start-up) and --jobs >= 1")
    sys.path.insert(0, str(PROJECT))
    from server_app.config import resolve

    cfg, _ = resolve(
        {"method": args.method, "experiment": args.experiment, "overrides": args.overrides}
    )
    full = cfg["num_rounds"]
    from feddb.resources import mps

    results = {}
    try:
        with tempfile.TemporaryDirectory() as tmp, mps(args.mps) as mps_line:
            if mps_line:
                print(mps_line)
            for n in jobs:
                m = run_batch(
                    n, args.rounds, args.experiment, args.method, args.overrides, Path(tmp)
                )
                m["rounds_per_second"] = n / m["round_seconds"]
                m["projected_sweep_seconds"] = projected_sweep_seconds(m, n, args.sweep_runs, full)
                results[n] = m
    except RuntimeError as err:
        if not str(err).startswith("--mps"):
            raise
        raise SystemExit(f"feddb throughput: {err}") from None
    print(
        f"{args.method}, experiment={args.experiment} ({full} rounds a run), "
        f"{args.rounds} rounds measured per run:\n"
    )
    print(table(results, args.sweep_runs, full))
    phases = results[jobs[0]]["phases"]
    print(f"where a steady round goes, {jobs[0]} run(s) at once (median seconds):")
    for key, value in phases.items():
        print(f"  {key:<34} {value:8.3f}")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {"config": {**vars(args), "full_rounds": full}, "results": results}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

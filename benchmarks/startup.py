"""From `make run` to the first round: `feddb startup`.

    .venv/bin/feddb startup --repeat 5        # about 20 s a run here

Runs the launcher as `make run` does (the default FedDB run, stopped after its first round) N times,
each with its own ports, so that every run starts its own SuperLink, and prints each start-up
step's seconds after the launcher started and after the SuperLink started. The steps come from
the run directory's `startup.json`, which every run writes after its first round (fssl/profiling.py
`Timeline`): process start times from /proc, the ServerApp's own steps from its clock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from feddb.launch import PROJECT

STEPS = (
    ("superlink_start", "SuperLink process started (by `flwr run`)"),
    ("superexec_start", "SuperExec process started (by the SuperLink)"),
    ("process_start", "simulation process started (by the SuperExec: `flwr-simulation`)"),
    ("server_main", "ServerApp entered (its imports done; Ray starting beside it)"),
    ("data_ready", "data loaded and partitioned"),
    ("client_process_start", "first client worker process started (Ray)"),
    ("client_app_imported", "last client worker imported the ClientApp (torch, ...)"),
    ("nodes_bound", "every node answered its partition query"),
    ("first_round_sent", "round 1's instructions sent"),
    ("first_round_done", "round 1 aggregated, evaluated and recorded"),
)


def one_run(
    out: Path, home: Path, run_config: str, launcher_args: tuple[str, ...] = ()
) -> dict[str, float]:
    env = dict(os.environ, FLWR_HOME=str(home))
    rc = f"num-server-rounds=1 output-dir='{out}'" + (f" {run_config}" if run_config else "")
    res = subprocess.run(
        [sys.executable, "-m", "feddb.launch", "--run-config", rc, *launcher_args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"the run failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    return json.loads((out / "startup.json").read_text())


def table(runs: list[dict[str, float]]) -> str:
    lines = [
        "| step | s after the launcher started | s after the SuperLink started |",
        "|---|---|---|",
    ]
    for key, label in STEPS:
        since_launch = [r[key] - r["launch"] for r in runs if r.get(key) and r.get("launch")]
        since_link = [
            r[key] - r["superlink_start"] for r in runs if r.get(key) and r.get("superlink_start")
        ]

        def cell(v: list[float]) -> str:
            return f"{np.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" if v else "n/a"

        lines.append(f"| {label} | {cell(since_launch)} | {cell(since_link)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs (the table gives medians and ranges)"
    )
    ap.add_argument("--run-config", default="", help="extra run-config for every run")
    ap.add_argument("--json", help="also write every run's timeline to this file")
    ap.add_argument(
        "--flower-ray",
        action="store_true",
        help="runs without the launcher's Ray head (`feddb run --flower-ray`)",
    )
    args = ap.parse_args(argv)
    if args.repeat < 1:
        print("error: --repeat must be at least 1", file=sys.stderr)
        return 2
    runs = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for i in range(args.repeat):
            try:
                runs.append(
                    one_run(
                        tmp / f"run{i}",
                        tmp / "flwr-home",
                        args.run_config,
                        ("--flower-ray",) if args.flower_ray else (),
                    )
                )
            except RuntimeError as err:
                print(f"error: {err}", file=sys.stderr)
                return 1
            r = runs[-1]
            print(
                f"[startup] run {i + 1}/{args.repeat}: round 1 done "
                f"{r['first_round_done'] - r['superlink_start']:.1f} s after the SuperLink "
                f"started, {r['first_round_done'] - r['launch']:.1f} s after the launcher",
                flush=True,
            )
    print(f"\nmedian (range) over {len(runs)} runs, {os.cpu_count()} CPU cores\n")
    print(table(runs))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

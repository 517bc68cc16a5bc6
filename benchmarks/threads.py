"""Seconds per round by CPU threads, idle and beside a busy core: `feddb threads`.

    .venv/bin/feddb threads                 # about 8 min on 2 cores

The project's rule (fssl.runtime.cpu_threads): a process that computes on the CPU uses
OMP_NUM_THREADS where its launcher or the user set it (Ray: the cores it reserved for a simulated
client; `feddb sweep --jobs N`: cores / N; `feddb deploy local`: cores / nodes), every core where
it has the machine to itself (a deployed SuperNode's worker, a deployed ServerApp), and one thread
otherwise. This runs the default FedDB configuration for --rounds rounds in each engine, `feddb
local` (in process) and `feddb run` (Flower's simulation), with the rule ("chosen"), with
OMP_NUM_THREADS=1, and with PyTorch's default of every core in every process; first on an idle
machine, then beside one process that keeps a core busy (what a second run or a build does). Then
plain `flwr run .` of the default (Flower's own simulation settings: one client at a time with
the cores Ray reserves for it) beside `feddb run`, to compare their rounds. Seconds per round: the
mean of rounds 2 onwards of each run's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from feddb.launch import PROJECT, free_port

CORES = len(os.sched_getaffinity(0))
SETTINGS = {  # name -> OMP_NUM_THREADS (None: the rule's choice)
    "chosen": None,
    "OMP_NUM_THREADS=1": "1",
    f"PyTorch's default ({CORES} threads)": str(CORES),
}


def per_round(run_dir: Path) -> float:
    """Mean seconds of rounds 2 onwards (round 1 carries start-up: Ray's workers, caches)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    seconds = [json.loads(line)["round_seconds"] for line in lines if line.strip()]
    return float(np.mean(seconds[1:] or seconds))


def env_for(threads: str | None, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = threads
    env.update(FLWR_HOME=str(home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    return env


def run(engine: str, threads: str | None, rounds: int, tmp: Path) -> float:
    """One run of `feddb local` or `feddb run`, or plain `flwr run .` (engine "flwr"); its
    seconds per round."""
    out = Path(tempfile.mkdtemp(dir=tmp)) / "run"
    rc = f"num-server-rounds={rounds} output-dir='{out}'"
    env = env_for(threads, out.parent / "home")
    if engine == "flwr":
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(free_port())
        env["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_port())
        cmd = [str(Path(sys.executable).parent / "flwr"), "run", ".", "--stream"]
        cmd += ["--run-config", rc]
    else:
        module = {"local": "feddb.inprocess", "run": "feddb.launch"}[engine]
        cmd = [sys.executable, "-m", module, "--run-config", rc]
    try:
        res = subprocess.run(cmd, cwd=PROJECT, env=env, capture_output=True, text=True)
    finally:
        if engine == "flwr":  # plain `flwr run` leaves its local SuperLink running
            stop_superlink(out.parent / "home")
    if not (out / "metrics.jsonl").is_file() or (engine != "flwr" and res.returncode != 0):
        raise RuntimeError(f"{engine} failed:\n{res.stdout[-1500:]}{res.stderr[-1500:]}")
    return per_round(out)


def stop_superlink(home: Path) -> None:
    """Stop the processes whose environment carries this FLWR_HOME (the local SuperLink that
    plain `flwr run` started, its SuperExec and simulation)."""
    from fssl.profiling import marked, stop

    stop(marked(str(home), "FLWR_HOME"))


@contextlib.contextmanager
def busy_core(on: bool) -> Iterator[None]:
    """One process spinning on a core for the duration."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each run (>= 2)")
    ap.add_argument(
        "--engines",
        default="local,run",
        help="comma-separated: local (feddb local), run (feddb run)",
    )
    ap.add_argument("--no-flwr", action="store_true", help="leave out plain `flwr run .`")
    args = ap.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    if args.rounds < 2 or not set(engines) <= {"local", "run"}:
        print("error: --rounds must be >= 2 and --engines local and/or run", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="feddb-threads-") as tmp:
        for load in (False, True):
            with busy_core(load):
                for engine in engines:
                    for name, threads in SETTINGS.items():
                        seconds = run(engine, threads, args.rounds, Path(tmp))
                        rows.append((engine, name, "one core busy" if load else "idle", seconds))
                        print(f"[threads] feddb {engine}, {rows[-1][2]}, {name}: {seconds:.2f} s")
        if not args.no_flwr:
            for engine in ("run", "flwr"):
                seconds = run(engine, None, args.rounds, Path(tmp))
                rows.append((engine, "chosen", "idle, side by side", seconds))
                print(f"[threads] {engine}: {seconds:.2f} s a round")
    print(f"\n{CORES} cores; seconds per round (rounds 2-{args.rounds}), the default run:\n")
    print("| engine | threads | machine | s a round |\n|---|---|---|---|")
    for engine, name, load, seconds in rows:
        shown = "plain `flwr run .`" if engine == "flwr" else f"`feddb {engine}`"
        print(f"| {shown} | {name} | {load} | {seconds:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

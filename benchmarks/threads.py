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

    .venv/bin/feddb threads --step          # about 2 min: the cost of thread-invariant kernels

--step times one training step (forward, backward, SGD) of the CNN and of WRN-28-2 on one
thread and on every core, with the project's kernels, which give the same bits on any thread
count (fssl.models.Conv2d, MKL's strict mode), and with torch's own: the median of --repeats
steps, each setting in a process of its own (MKL fixes its mode at its first call).
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


STEP_MODELS = {  # name -> (model config, batch shape): the default CNN, WRN-28-2 on CIFAR-10
    "cnn": ({"name": "cnn", "norm": "batchstat", "hidden": 128}, (512, 1, 28, 28)),
    "wrn28_2": ({"name": "wrn28_2", "norm": "batchstat"}, (64, 3, 32, 32)),
}


def step_seconds(model_name: str, threads: int, invariant: bool, repeats: int) -> float:
    """Median seconds of one training step, in this process (called in a fresh one)."""
    if not invariant:
        os.environ["MKL_CBWR"] = "AUTO"  # before fssl's import sets the strict mode
    import time

    import torch

    from fssl.models import Conv2d, build_model
    from fssl.sgd import SGD

    torch.set_num_threads(threads)
    mcfg, shape = STEP_MODELS[model_name]
    model = build_model(mcfg, 10, shape[1], shape[-1])
    if not invariant:  # torch's own convolution backward
        for m in model.modules():
            if isinstance(m, Conv2d):
                m.__class__ = torch.nn.Conv2d
    opt = SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    x, y = torch.randn(shape), torch.randint(0, 10, (shape[0],))
    seconds = []
    for _ in range(repeats + 1):  # the first builds oneDNN's kernels
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds[1:]))


def step_table(repeats: int) -> None:
    """The --step table: each model, thread count and kernel choice in a process of its own."""
    print(
        "| model | threads | torch's own, ms | thread-invariant, ms | cost |\n|---|---|---|---|---|"
    )
    for model_name in STEP_MODELS:
        for threads in sorted({1, CORES}):
            ms = []
            for invariant in (False, True):
                code = (
                    "from benchmarks.threads import step_seconds; "
                    f"print(step_seconds({model_name!r}, {threads}, {invariant}, {repeats}))"
                )
                env = env_for(None, Path(tempfile.gettempdir()))
                out = subprocess.run(
                    [sys.executable, "-c", code],
                    cwd=PROJECT,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                ms.append(1000 * float(out.split()[-1]))
            cost = f"{100 * (ms[1] / ms[0] - 1):+.0f} %"
            print(f"| {model_name} | {threads} | {ms[0]:.1f} | {ms[1]:.1f} | {cost} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each run (>= 2)")
    ap.add_argument(
        "--engines",
        default="local,run",
        help="comma-separated: local (feddb local), run (feddb run)",
    )
    ap.add_argument("--no-flwr", action="store_true", help="leave out plain `flwr run .`")
    ap.add_argument("--step", action="store_true", help="time one training step instead")
    ap.add_argument("--repeats", type=int, default=9, help="--step: steps timed per setting")
    args = ap.parse_args(argv)
    if args.step:
        step_table(args.repeats)
        return 0
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

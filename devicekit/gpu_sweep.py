"""On a lent GPU machine: install the carried wheels, run a sweep preset in-process under MPS
within a time budget, and pack each finished run's small files into $OUT.

    python3 devicekit/gpu_sweep.py --budget 420 --jobs 16 -- -m sweep=competitors_exact_800

(the device tool's `run`, with `carry: ["devicekit/wheels"]` from devicekit/fetch_wheels.sh).
The wheels go to /tmp/site (pip --no-index --no-deps), the sweep runs `feddb sweep --mps` with
the in-process launcher (Ray is not carried) and is stopped at the budget (it resumes its runs
when started again); the runs that wrote summary.json go into $OUT as one tar.xz in parts under
16 MiB (at most 4: $OUT returns 64 MiB), without checkpoints, TensorBoard or figures. Unpack with
`cat runs.tar.xz.* | tar -xJ`.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
SITE = Path("/tmp/site")
PART_BYTES = 15 << 20  # under the 16 MiB a returned file may have
MAX_PARTS = 4  # 60 MiB: $OUT returns at most 64 MiB together
LEFT_OUT_SUFFIXES = (".pt", ".sha256", ".png")  # checkpoints, their digests, figures
LEFT_OUT_DIRS = ("tensorboard", "wandb", "mlruns")


def install(wheels: Path) -> None:
    """The wheels into SITE, without an index or dependency resolution (they are the set)."""
    found = sorted(str(w) for w in wheels.glob("*.whl"))
    if not found:
        raise SystemExit(f"no wheels in {wheels}: run devicekit/fetch_wheels.sh here first")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        + ["--no-cache-dir", "--upgrade", "--target", str(SITE), *found],
        check=True,
    )


def sweep(args: list[str], jobs: int, budget: float) -> int:
    """`feddb sweep --jobs N --mps` with the in-process launcher, SIGTERM at the budget (the
    sweep stops its runs and exits), SIGKILL of its group 90 s later."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PROJECT), str(SITE)]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [sys.executable, "-m", "feddb.cli", "sweep", "--jobs", str(jobs), "--mps", *args]
    cmd.append("launcher=[python,-m,feddb.inprocess]")
    proc = subprocess.Popen(cmd, cwd=PROJECT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        print(f"[kit] budget of {budget:.0f} s reached: stopping the sweep", flush=True)
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()


def small_files(run_dir: Path) -> list[Path]:
    """A run's files less checkpoints, TensorBoard, tracking stores and figures."""
    return sorted(
        p
        for p in run_dir.rglob("*")
        if p.is_file()
        and not p.name.endswith(LEFT_OUT_SUFFIXES)
        and not set(p.relative_to(run_dir).parts[:-1]) & set(LEFT_OUT_DIRS)
    )


def finished_runs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("summary.json") if ".hydra" not in p.parts)


def pack(root: Path, out: Path, part_bytes: int = PART_BYTES, max_parts: int = MAX_PARTS):
    """The finished runs under `root` as `out/runs.tar.xz.NN` parts of at most `part_bytes`;
    their paths relative to root's parent. Returns (parts, runs packed); raises SystemExit when
    the archive would need more than `max_parts` parts."""
    buf, runs = io.BytesIO(), finished_runs(root)
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for run_dir in runs:
            for f in small_files(run_dir):
                tar.add(f, arcname=str(f.relative_to(root.parent)))
    data = buf.getvalue()
    chunks = [data[i : i + part_bytes] for i in range(0, len(data), part_bytes)]
    if len(chunks) > max_parts:
        raise SystemExit(
            f"{len(runs)} runs pack to {len(data) >> 20} MiB, over {max_parts} parts of "
            f"{part_bytes >> 20} MiB: pack fewer runs (a smaller --root)"
        )
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, chunk in enumerate(chunks):
        parts.append(out / f"runs.tar.xz.{i:02d}")
        parts[-1].write_bytes(chunk)
    return parts, runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--budget", type=float, default=420, help="seconds the sweep may run")
    ap.add_argument("--jobs", type=int, default=16, help="runs at once (feddb sweep --jobs)")
    ap.add_argument("--wheels", default=str(PROJECT / "devicekit" / "wheels"))
    ap.add_argument("--root", default="runs", help="the sweep's out, relative to the project")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"), help="where the parts go")
    ap.add_argument("--pack-only", action="store_true", help="only pack --root into --out")
    ap.add_argument("sweep_args", nargs="*", help="after --: the sweep's own arguments")
    args = ap.parse_args(argv)
    start = time.monotonic()
    if not args.pack_only:
        install(Path(args.wheels))
        code = sweep(args.sweep_args, args.jobs, args.budget - (time.monotonic() - start))
        print(f"[kit] sweep exit {code} after {time.monotonic() - start:.0f} s", flush=True)
    parts, runs = pack(PROJECT / args.root, Path(args.out))
    print(f"[kit] {len(runs)} finished runs in {len(parts)} part(s) under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

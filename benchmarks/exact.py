"""`feddb bench --preset exact`: the authors' exact regime (full-batch clients, the small CNN) as a
GPU would need it measured: a round of one run alone, N runs at once, the round's counted FLOPs
and how far the round sits above its floor at the device's measured rate.

    feddb bench --preset exact                               # CPU, about 5 minutes
    feddb bench --preset exact --device cuda --jobs 16 --mps --json exact.json

- one run alone: `--rounds` rounds in this process with the fast path and with the reference
  path (the code before the fast small-model path, `reference_path`), alternately, `--repeats`
  times each; seconds a round are the median of rounds 2 onwards (round 1 builds caches);
- the replaced code alone: the weak view's flip, crop and normalisation of a client's images,
  both paths alternately call by call (a round's time on a busy CPU varies more than the
  difference the fast path makes there);
- N runs at once (`--jobs`): `feddb throughput`'s batch of in-process runs, rounds a second;
- the round's FLOPs: everything torch computes in a round (the clients' passes and steps, the
  server's evaluation), counted under FlopCounterMode as a 2-round run less a 1-round run;
- the floor: those FLOPs at the rate of the model's own training step on the device (one CPU
  thread, as a simulated client has), and the ratio of the measured round to it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from fssl import augment

EXPERIMENT = "miniature_authors_exact"
METHOD = "fixmatch"
STEP_BATCH = 256  # about a client's full batch: its labeled and confident unlabeled images


def flip_crop_reference(x, flip, gen=None):
    """fssl.augment.flip_crop before the fast path: advanced indexing over N x H x W."""
    n, c, h, w = x.shape
    pad = round(0.125 * min(h, w))
    mirror = augment._rand(n, gen, x.device) < 0.5 if flip else None
    if pad == 0:
        return x if mirror is None else torch.where(mirror[:, None, None, None], x.flip(-1), x)
    oy = (augment._rand(n, gen, x.device) * (2 * pad + 1)).long().clamp_max(2 * pad)
    ox = (augment._rand(n, gen, x.device) * (2 * pad + 1)).long().clamp_max(2 * pad)
    rows = augment._reflect(oy[:, None] + torch.arange(h, device=x.device) - pad, h)
    cols = augment._reflect(ox[:, None] + torch.arange(w, device=x.device) - pad, w)
    if mirror is not None:
        cols = torch.where(mirror[:, None], w - 1 - cols, cols)
    batch = torch.arange(n, device=x.device)[:, None, None]
    picked = x.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]
    return augment.nchw(picked.permute(0, 3, 1, 2))


def normalize_reference(x, mean, std, dtype=torch.float32):
    """fssl.augment.normalize before the fast path: its constants made at every call."""
    m = torch.tensor(mean, device=x.device, dtype=dtype)[None, :, None, None] * 255
    s = torch.tensor(std, device=x.device, dtype=dtype)[None, :, None, None] * 255
    return (x.to(dtype) - m) / s


@contextlib.contextmanager
def reference_path() -> Iterator[None]:
    """The code before the fast small-model path, patched in for the block: the same results
    (tests/test_fast_path.py), so the bench can time both side by side."""
    from client_app import work
    from fssl.train import resolve_device

    saved = (augment.flip_crop, augment.normalize, work.client_device)
    augment.flip_crop, augment.normalize = flip_crop_reference, normalize_reference
    work.client_device = resolve_device
    try:
        yield
    finally:
        augment.flip_crop, augment.normalize, work.client_device = saved


def run_config(rounds: int, out: Path, device: str, method: str, extra: str) -> dict:
    return {
        "method": method,
        "experiment": EXPERIMENT,
        "num-server-rounds": rounds,
        "output-dir": str(out),
        "overrides": f"device={device} logging.tensorboard=false checkpoint.every=0 {extra}",
    }


def round_seconds(run_dir: Path) -> float:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    seconds = [json.loads(line)["round_seconds"] for line in lines if line.strip()]
    return statistics.median(seconds[1:] or seconds)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """A run's lines and Flower's warnings kept off the bench's output."""
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        flwr_log.setLevel(level)


def alone(args, tmp: Path) -> dict[str, list[float]]:
    """Seconds a round of one in-process run, fast and reference paths alternately."""
    from feddb.inprocess import run_in_process

    out: dict[str, list[float]] = {"fast": [], "reference": []}
    for i in range(args.repeats):
        for path in ("fast", "reference"):
            run_dir = tmp / f"{path}{i}"
            rc = run_config(args.rounds, run_dir, args.device, args.method, args.overrides)
            with reference_path() if path == "reference" else contextlib.nullcontext(), quiet():
                run_in_process(rc)
            out[path].append(round_seconds(run_dir))
    return out


CLIENT_IMAGES = 400  # about an exact-regime client's pool: its labeled and unlabeled images


def replaced_code(args, calls: int = 200) -> dict[str, float]:
    """Milliseconds a call of the code the fast path replaced (the weak view's flip and crop,
    then normalisation) on a client's CLIENT_IMAGES uint8 MNIST images, fast and reference
    alternately `calls` times each (the median): short enough that both see the same load."""
    x = torch.randint(0, 256, (CLIENT_IMAGES, 1, 28, 28), dtype=torch.uint8, device=args.device)
    mean, std = (0.1307,), (0.3081,)
    paths = {
        "fast": (augment.flip_crop, augment.normalize),
        "reference": (flip_crop_reference, normalize_reference),
    }
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(calls):
        for name, (crop, norm) in paths.items():
            started = time.perf_counter()
            norm(crop(x, True), mean, std)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times[name].append(1e3 * (time.perf_counter() - started))
    return {k: statistics.median(v) for k, v in times.items()}


def round_flops(args, tmp: Path) -> float:
    from benchmarks.floor import counted_flops

    def count(rounds: int) -> float:
        rc = run_config(rounds, tmp / f"flops{rounds}", args.device, args.method, args.overrides)
        return counted_flops(rc)

    return count(2) - count(1)


def step_rate(args) -> float:
    """FLOP/s of the model's training step (forward and backward) on the device, one CPU
    thread, over STEP_BATCH images."""
    from benchmarks.roundfloor import step_rate as rate
    from server_app.config import compose

    cfg = compose([f"experiment={EXPERIMENT}", f"device={args.device}"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return rate(cfg, args.device, STEP_BATCH, repeat=2)
    finally:
        torch.set_num_threads(threads)


def measure(args) -> dict:
    from benchmarks.throughput import run_batch
    from fssl.provenance import provenance

    results: dict = {"preset": "exact", "experiment": EXPERIMENT, "config": vars(args)}
    results["provenance"] = provenance(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        started = time.perf_counter()
        results["replaced_code_ms"] = replaced_code(args)
        results["alone_round_seconds"] = alone(args, tmp_path)
        extra = f"device={args.device} {args.overrides}"
        if args.jobs:
            batch = run_batch(args.jobs, args.rounds, EXPERIMENT, args.method, extra, tmp_path)
            results["together"] = {"jobs": args.jobs, **batch}
        results["round_flops"] = round_flops(args, tmp_path)
        results["step_flops_per_s"] = step_rate(args)
        results["bench_seconds"] = time.perf_counter() - started
    fast = statistics.median(results["alone_round_seconds"]["fast"])
    results["floor_seconds"] = results["round_flops"] / results["step_flops_per_s"]
    results["over_floor"] = fast / results["floor_seconds"]
    return results


def paired_ratio(results: dict) -> str:
    """The fast path's round over the reference path's, repeat by repeat (the two runs of a repeat
    run back to back, so they share the machine's load): the median ratio and its range."""
    alone_s = results["alone_round_seconds"]
    ratios = [f / r for f, r in zip(alone_s["fast"], alone_s["reference"], strict=True)]
    return f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]"


def table(results: dict) -> str:
    """The figures as one markdown table (printed, and rendered by `feddb tables`)."""
    alone_s = {k: statistics.median(v) for k, v in results["alone_round_seconds"].items()}
    rows = [
        "| a round | seconds |",
        "|---|---|",
        f"| alone, fast path | {alone_s['fast']:.3f} |",
        f"| alone, reference path | {alone_s['reference']:.3f} |",
        f"| fast ÷ reference, paired by repeat: median [min, max] | {paired_ratio(results)} |",
    ]
    code = results.get("replaced_code_ms")
    if code:
        rows.append(
            f"| the replaced code alone (flip, crop, normalise {CLIENT_IMAGES} images), fast ÷ "
            f"reference | {code['fast']:.3f} ms ÷ {code['reference']:.3f} ms = "
            f"{code['fast'] / code['reference']:.2f} |"
        )
    together = results.get("together")
    if together:
        rows.append(f"| {together['jobs']} runs at once, each | {together['round_seconds']:.3f} |")
    rows.append(
        f"| floor: {results['round_flops'] / 1e9:.1f} GFLOP at the step's "
        f"{results['step_flops_per_s'] / 1e9:.1f} GFLOP/s | {results['floor_seconds']:.3f} "
        f"(**{results['over_floor']:.1f}×** below the round) |"
    )
    return "\n".join(rows)


def main(args) -> int:
    """`feddb bench --preset exact` (benchmarks/speed.py parses the arguments)."""
    results = measure(args)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0

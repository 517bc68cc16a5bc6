"""How many simulated clients share one GPU: Ray's `client-resources-num-gpus` from measured memory.

`feddb run --gpus-per-client auto` runs one client round of the configured method
in a separate process (this module's `main`), reads its peak CUDA memory, and gives each client the
GPU share 1/k, with k the number of such clients (each with its own CUDA context) that fit in 90 %
of the GPU's memory, capped by the clients per round. Ray then runs k clients at a time on the GPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

CONTEXT_BYTES = 600 * 2**20       # a CUDA context and allocator slack per worker process


def gpu_share(total_bytes: int, client_bytes: int, clients_per_round: int,
              context_bytes: int = CONTEXT_BYTES, headroom: float = 0.9) -> tuple[float, int]:
    """(GPU share per client, clients at a time): the most clients whose peak memory plus a CUDA
    context each fit in `headroom` of the GPU, at least 1, at most the clients per round."""
    per_client = client_bytes + context_bytes
    k = max(1, min(clients_per_round, math.floor(headroom * total_bytes / per_client)))
    return 1.0 / k, k


def probe(cfg: dict) -> dict:
    """Peak CUDA memory of one client round (partition 0) and the GPU's total memory."""
    import torch

    from fssl.methods import make_trainer
    from fssl.runtime import client_data_for, data_meta, dataset_for, model_for

    device = torch.device("cuda")
    cfg = {**cfg, "data_meta": data_meta(dataset_for(cfg))}
    meta = cfg["data_meta"]
    data = client_data_for(cfg, 0, device)
    model = model_for(cfg, device)
    torch.cuda.reset_peak_memory_stats()
    make_trainer(cfg, meta["mean"], meta["std"], device).fit(model, data, 0.01, seed=0)
    return {"peak_bytes": torch.cuda.max_memory_allocated(),
            "total_bytes": torch.cuda.get_device_properties(0).total_memory}


def auto_gpus_per_client(cfg: dict, clients_per_round: int) -> tuple[float, str]:
    """The share for `--gpus-per-client auto` and a line saying how it was chosen; 0 without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return 0.0, "no CUDA device: clients run on the CPU (no GPU resource requested)"
    out = subprocess.run([sys.executable, "-m", "feddb.resources"], input=json.dumps(cfg),
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if out.returncode != 0:
        raise RuntimeError(f"measuring a client's GPU memory failed:\n{out.stderr[-2000:]}")
    m = json.loads(out.stdout.strip().splitlines()[-1])
    share, k = gpu_share(m["total_bytes"], m["peak_bytes"], clients_per_round)
    return share, (f"one client round peaks at {m['peak_bytes'] / 2**20:.0f} MiB of "
                   f"{m['total_bytes'] / 2**30:.0f} GiB: {k} clients at a time, "
                   f"client-resources-num-gpus={share:.4g}")


@contextlib.contextmanager
def mps(enabled: bool) -> Iterator[str]:
    """NVIDIA's Multi-Process Service around a GPU simulation: with it the kernels of the clients
    that share the GPU (one process each) run at once instead of time-sliced. Starts the control
    daemon unless one answers already, and stops it afterwards only if it started it. Yields a
    line saying what it did."""
    if not enabled:
        yield ""
        return
    ctl = shutil.which("nvidia-cuda-mps-control")
    if ctl is None:
        raise RuntimeError("--mps: nvidia-cuda-mps-control is not on PATH (it comes with the "
                           "NVIDIA driver); run without --mps or install the driver's utilities")

    def control(command: str | None) -> subprocess.CompletedProcess:
        return subprocess.run([ctl] + ([] if command else ["-d"]), input=command, text=True,
                              capture_output=True, timeout=30, env=os.environ)

    if control("get_server_list").returncode == 0:
        yield "MPS: a control daemon is already running; using it"
        return
    started = control(None)
    if started.returncode != 0:
        raise RuntimeError(f"--mps: nvidia-cuda-mps-control -d failed: "
                           f"{(started.stderr or started.stdout).strip()}")
    try:
        yield "MPS: control daemon started for this run"
    finally:
        control("quit")


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(json.dumps(probe(json.loads(sys.stdin.read()))))


if __name__ == "__main__":
    main()

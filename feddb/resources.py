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
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

CONTEXT_BYTES = 600 * 2**20  # a CUDA context and allocator slack per worker process


def gpu_share(
    total_bytes: int,
    client_bytes: int,
    clients_per_round: int,
    context_bytes: int = CONTEXT_BYTES,
    headroom: float = 0.9,
) -> tuple[float, int]:
    """(GPU share per client, clients at a time): the most clients whose peak memory plus a CUDA
    context each fit in `headroom` of the GPU, at least 1, at most the clients per round."""
    per_client = client_bytes + context_bytes
    k = max(1, min(clients_per_round, math.floor(headroom * total_bytes / per_client)))
    return 1.0 / k, k


def probe(cfg: dict) -> dict:
    """Peak CUDA memory of one client round (partition 0) and the GPU's total memory."""
    import torch

    from fssl.instruction import Instruction
    from fssl.methods import make_trainer
    from fssl.runtime import client_data_for, data_meta, dataset_for, model_for

    device = torch.device("cuda")
    cfg = {**cfg, "data_meta": (meta := data_meta(dataset_for(cfg)))}
    data = client_data_for(cfg, 0, device)
    model = model_for(cfg, device)
    torch.cuda.reset_peak_memory_stats()
    make_trainer(cfg, meta["mean"], meta["std"], device).fit(model, data, Instruction(0.01))
    return {
        "peak_bytes": torch.cuda.max_memory_allocated(),
        "total_bytes": torch.cuda.get_device_properties(0).total_memory,
    }


def auto_gpus_per_client(cfg: dict, clients_per_round: int) -> tuple[float, str]:
    """The share for `--gpus-per-client auto` and a line saying how it was chosen; 0 without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return 0.0, "no CUDA device: clients run on the CPU (no GPU resource requested)"
    out = subprocess.run(
        [sys.executable, "-m", "feddb.resources"],
        input=json.dumps(cfg),
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    if out.returncode != 0:
        raise RuntimeError(f"measuring a client's GPU memory failed:\n{out.stderr[-2000:]}")
    m = json.loads(out.stdout.strip().splitlines()[-1])
    share, k = gpu_share(m["total_bytes"], m["peak_bytes"], clients_per_round)
    return share, (
        f"one client round peaks at {m['peak_bytes'] / 2**20:.0f} MiB of "
        f"{m['total_bytes'] / 2**30:.0f} GiB: {k} clients at a time, "
        f"client-resources-num-gpus={share:.4g}"
    )


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
        raise RuntimeError(
            "--mps: nvidia-cuda-mps-control is not on PATH (it comes with the "
            "NVIDIA driver); run without --mps or install the driver's utilities"
        )

    def control(command: str | None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [ctl] + ([] if command else ["-d"]),
            input=command,
            text=True,
            capture_output=True,
            timeout=30,
            env=os.environ,
        )

    if control("get_server_list").returncode == 0:
        yield "MPS: a control daemon is already running; using it"
        return
    started = control(None)
    if started.returncode != 0:
        raise RuntimeError(
            f"--mps: nvidia-cuda-mps-control -d failed: "
            f"{(started.stderr or started.stdout).strip()}"
        )
    try:
        yield "MPS: control daemon started for this run"
    finally:
        control("quit")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_exe() -> str | None:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else shutil.which("ray")


class RayHead:
    """A Ray head started by `ray_head`: its address, and why it stopped if it has.

    Linux schedules a session's processes as one group (autogroup), so the head, in a session of
    its own, competes with Flower's processes as a peer whatever its processes' niceness. While the
    run starts, its session yields (START_NICE): Flower's SuperLink, SuperExec and ServerApp start
    first (measured: round 1 sent 11.1 s after the SuperLink instead of 15.1 s). Once Ray has
    started a worker, start-up is over and the session gets an equal share again: its raylet relays
    every reply, and kept at the lower share it added about 0.2 s to every round. The yield lasts
    at most START_YIELD_SECONDS: on a machine busy with other work the head, yielding to all of
    it, came up too late for Flower's `ray.init` (measured: 3 of 3 runs failed at load 8)."""

    def __init__(self, proc: subprocess.Popen, address: str, temp: Path) -> None:
        self.proc, self.address, self.temp = proc, address, temp
        self.yielding = set_session_nice(proc.pid, START_NICE)
        self.started = time.monotonic()

    def watch(self) -> str | None:
        """Polled by the launcher during the run: `failure()`, and the end of the start-up share."""
        late = time.monotonic() - self.started > START_YIELD_SECONDS
        if self.yielding and (late or workers_started(self.proc.pid)):
            set_session_nice(self.proc.pid, 0)
            self.yielding = False
        return self.failure()

    def failure(self) -> str | None:
        """None while the head runs; else its exit code and the end of its log."""
        if self.proc.poll() is None:
            return None
        log = self.temp / "ray-start.log"
        tail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
        return f"the Ray head started for this run exited (code {self.proc.returncode}):\n{tail}"


@contextlib.contextmanager
def ray_head(enabled: bool, grace: float = 10.0) -> Iterator[RayHead | None]:
    """A Ray head for one simulation, started in the background as soon as the launcher starts,
    so that Ray comes up while Flower's SuperLink, SuperExec and simulation process start (Flower's
    simulation joins it through RAY_ADDRESS instead of starting Ray itself; its `ray.init` waits
    for a head still starting). What Ray would start for a local `ray.init()`, less the
    autoscaler's monitor (no cluster to scale), the dashboard and idle workers, on free ports, so that runs
    side by side do not collide. Afterwards the whole process group is stopped. Yields None when
    not enabled or when `ray` is not found."""
    exe = ray_exe()
    if not enabled or exe is None:
        yield None
        return
    temp = Path(tempfile.mkdtemp(prefix="feddb-ray-"))  # short: Ray's socket paths must fit
    port = free_port()
    # not --dashboard-agent-grpc-port (Ray's metrics agent): left to Ray, which picks a free one
    # itself (no fixed default to collide on), the GCS and the raylet learn from the agent that a
    # Ray without its dashboard extra serves no metrics; told the port, they retried it for 30 s and
    # each logged an error in the middle of the run
    ports = {
        f"--{k}": str(free_port())
        for k in (
            "dashboard-port",
            "dashboard-agent-listen-port",
            "metrics-export-port",
            "runtime-env-agent-port",
            "ray-client-server-port",
        )
    }
    cmd = [
        exe,
        "start",
        "--head",
        "--block",
        "--port",
        str(port),
        "--node-ip-address",
        "127.0.0.1",
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
        "--no-monitor",
        "--temp-dir",
        str(temp),
        *(x for kv in ports.items() for x in kv),
        # workers and drivers bind ports the OS picks, as under a local `ray.init()`: `ray start`
        # hands out 10002-19999 in order from every head, so two runs side by side gave their
        # drivers the same port and the second failed ("Failed to start the grpc server", 10002)
        "--min-worker-port",
        "0",
        "--max-worker-port",
        "0",
        # no idle workers: Flower's actors carry their own runtime env and start their own
        "--system-config",
        json.dumps({"enable_worker_prestart": False}),
    ]
    with open(temp / "ray-start.log", "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # its own group: stopped as a whole
    try:
        yield RayHead(proc, f"127.0.0.1:{port}", temp)
    finally:
        stop_group(proc, grace)
        shutil.rmtree(temp, ignore_errors=True)


def stop_group(proc: subprocess.Popen, grace: float, kill_wait: float = 5.0) -> None:
    """Stop the process group `proc` leads (started with start_new_session): SIGTERM, up to
    `grace` s for it to end, then SIGKILL, sent again while any member is left: a process the
    group forked after a signal (a raylet starting a worker as it goes down) did not get it."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        deadline = time.monotonic() + wait
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        while time.monotonic() < deadline and group_alive(proc.pid):
            proc.poll()
            time.sleep(0.1)
            if sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
    proc.poll()


START_NICE = 15  # the niceness Ray gives its workers; the head's session while the run starts
START_YIELD_SECONDS = 15.0  # at most this long (an unloaded start sends round 1 within 11 s)
RAY_SERVICES = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")


def set_session_nice(pid: int, nice: int) -> bool:
    """The CPU share of the session `pid` leads, as a niceness of its autogroup. Best effort: False
    where the kernel has no autogroup."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        return True
    except OSError:
        return False


def workers_started(session: int) -> bool:
    """Whether a Ray worker (a `ray::` process other than the head's own agents) runs in the
    session."""
    from fssl.profiling import cmdline, live_processes

    for pid, fields in live_processes():
        if int(fields[3]) == session:
            name = (cmdline(pid) or [b""])[0]
            if name.startswith(b"ray::") and not name.startswith(RAY_SERVICES):
                return True
    return False


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group is still alive (zombies count as gone)."""
    from fssl.profiling import live_processes

    return any(int(fields[2]) == pgid for _, fields in live_processes())


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(json.dumps(probe(json.loads(sys.stdin.read()))))


if __name__ == "__main__":
    main()

"""cProfile of an app's calls when FEDDB_PROFILE names a directory (`feddb overhead --profile`):
each process adds its calls to `<dir>/<side>-<pid>.prof`; the start-up timeline of a run; and the
processes of this machine, as /proc lists them (what the launchers stop: `stop`, `marked`)."""

from __future__ import annotations

import contextlib
import cProfile
import functools
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

_PROFILES: dict[str, cProfile.Profile] = {}


def profiled(side: str) -> Callable:
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            directory = os.environ.get("FEDDB_PROFILE")
            if not directory:
                return fn(*args, **kwargs)
            prof = _PROFILES.setdefault(side, cProfile.Profile())
            prof.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                prof.disable()
                prof.dump_stats(os.path.join(directory, f"{side}-{os.getpid()}.prof"))

        return wrapper

    return decorate


def stat_fields(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat after the command name: [0] state, [1] ppid, [2] pgrp, [3] session,
    [19] starttime
    (None if the process is gone or there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def alive(pid: int | str) -> bool:
    """Whether the process runs (a zombie, exited but not yet reaped by its parent, does not)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def live_processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, `stat_fields`) of every process that runs (zombies left out)."""
    for proc in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(proc.name)
        if fields is not None and fields[0] != "Z":
            yield int(proc.name), fields


def cmdline(pid: int) -> list[bytes]:
    """The process's arguments (empty if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def stop(pids: list[int], grace: float = 15.0) -> None:
    """SIGTERM the processes, then SIGKILL whatever is still alive after `grace` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if alive(p)]
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


TOKEN_VAR = "FEDDB_DEPLOYMENT"


def marked(token: str, var: str = TOKEN_VAR) -> list[int]:
    """Running processes whose environment has `var`=`token`, this one left out."""
    entry, found = f"{var}={token}".encode(), []
    for pid, _ in live_processes():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry in environ and pid != os.getpid():
            found.append(pid)
    return found


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, unwound as Ctrl-C is: the `finally` blocks on the way out stop
    the processes the command started (a terminal's SIGHUP used to end the launcher at once and
    leave its SuperLink and Ray head running). `code`: the exit status, 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """STOP_SIGNALS raise Interrupted, once: later ones are ignored, so that a second Ctrl-C, or
    the terminal's SIGHUP after it, cannot cut the clean-up short. The previous handlers come
    back afterwards (a test calls the launchers in its own process). Main thread only."""

    def handler(signum: int, _frame: object) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)


FLOWER_PROCESSES = (b"flower-superlink", b"flower-superexec", b"flwr-simulation")


def superlink_pids(port: int) -> list[int]:
    """Pids of the flower-superlink serving `port`, and of its SuperExec and simulation
    processes (they name it as their runtime API address), found through /proc."""
    pids = []
    mine = (str(port).encode(), f":{port}".encode())
    for pid, _ in live_processes():
        cmd = cmdline(pid)
        if any(name in c for c in cmd[:2] for name in FLOWER_PROCESSES) and any(
            c == mine[0] or c.endswith(mine[1]) for c in cmd
        ):
            pids.append(pid)
    return pids


def process_start(pid: int | str = "self") -> float | None:
    """Unix time at which a process started (Linux /proc; None elsewhere or if it is gone)."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        ticks = int(fields[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])  # /proc/stat's btime is whole s
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def ancestor_start(name: str) -> float | None:
    """Start time of this process or its nearest ancestor whose command line contains `name`."""
    pid = os.getpid()
    while pid > 1:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return None
        if name in cmd:
            return process_start(pid)
        fields = stat_fields(pid)
        if fields is None:
            return None
        pid = int(fields[1])
    return None


class Timeline:
    """Wall-clock marks of a run's start-up, written to run_dir/startup.json after its first round
    (`feddb startup` reads them): the launcher's start (FEDDB_LAUNCH_TIME, set by `feddb run`),
    the SuperLink's, its SuperExec's and this process's start (from /proc), then the ServerApp's own steps."""

    def __init__(self) -> None:
        launch = os.environ.get("FEDDB_LAUNCH_TIME")
        self.marks: dict[str, float | None] = {
            "launch": float(launch) if launch else None,
            "superlink_start": ancestor_start("flower-superlink"),
            "superexec_start": ancestor_start("flower-superexec"),
            "process_start": process_start(),
        }
        self.mark("server_main")
        self.written = False

    def mark(self, name: str) -> None:
        self.marks[name] = time.time()

    def write(self, path: str | os.PathLike) -> None:
        if not self.written:
            self.written = True
            with open(path, "w") as f:
                json.dump(self.marks, f, indent=2)

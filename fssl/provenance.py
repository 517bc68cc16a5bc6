"""Where a run's numbers come from: the code's commit, the date, the software and the machine. The
ServerApp writes it into each run directory (provenance.json), so that a table made from runs can
say which code made it and a later check can re-run the same thing."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]


def git(*args: str, cwd: Path) -> str | None:
    """What a git command prints in `cwd`; None without git, a repository or success."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_commit() -> tuple[str | None, bool | None]:
    """(commit, whether tracked files differ from it). FEDDB_COMMIT (set by the launchers) wins:
    `flwr run` installs the app outside the checkout, where git cannot see it."""
    env = os.environ.get("FEDDB_COMMIT")
    if env:
        return env, os.environ.get("FEDDB_DIRTY") == "1"
    commit = git("rev-parse", "HEAD", cwd=PROJECT)
    if commit is None:
        return None, None
    dirty = git("status", "--porcelain", "--untracked-files=no", cwd=PROJECT)
    return commit, bool(dirty)


def export_commit() -> None:
    """Put this checkout's commit in the environment of the runs this process starts."""
    commit, dirty = code_commit()
    if commit:
        os.environ["FEDDB_COMMIT"] = commit
        os.environ["FEDDB_DIRTY"] = "1" if dirty else "0"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(device: str) -> dict[str, Any]:
    import numpy
    import torch

    from fssl.train import resolve_device

    commit, dirty = code_commit()
    try:
        from importlib.metadata import version

        flwr_version = version("flwr")
    except Exception:  # noqa: BLE001 - a version string is a nicety
        flwr_version = None
    cpu = cpu_name()
    device = resolve_device(device).type  # what `auto` chose, so a table can name the GPU
    if device.startswith("cuda") and torch.cuda.is_available():
        cpu = torch.cuda.get_device_name(0)
    return {
        "commit": commit,
        "dirty": dirty,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "hardware": f"{cpu}, {os.cpu_count()} cores",
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "flwr": flwr_version,
    }

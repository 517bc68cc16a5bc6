"""Checkpoints that never unpickle arbitrary objects: one torch file of tensors, loaded with
`weights_only=True`; the non-tensor state is JSON stored in it as a byte tensor. The file is written
atomically (temporary file in the same directory, fsync, rename), so a crash leaves the previous
checkpoint whole; its SHA-256 is recorded beside it (checkpoint.pt.sha256), and the checkpoint it
replaces is kept as checkpoint.prev.pt (with its own). Loading takes the newest checkpoint whose
checksum holds and says which one it took (`find`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

FILE = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
STATE_KEY = "__state_json__"


class CheckpointError(ValueError):
    """No checkpoint of a run directory can be read; the message names the files."""


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def problem(path: Path) -> str:
    """Why `path` is not a good checkpoint ("" when it is): missing, its checksum does not
    match the one recorded when it was written, or (written before checksums) unreadable."""
    if not path.is_file():
        return "missing"
    side = _sidecar(path)
    if side.is_file():
        recorded = side.read_text().split()[0] if side.read_text().strip() else ""
        return "" if recorded == _sha256(path) else "checksum mismatch (truncated or corrupt)"
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any failure to read means: not usable
        return f"unreadable ({str(err).splitlines()[0][:80]})"
    return ""


def find(run_dir: Path) -> tuple[Path, str]:
    """The newest good checkpoint of `run_dir` and a line saying so when it is not the latest;
    CheckpointError naming the files when none is good."""
    latest, previous = run_dir / FILE, run_dir / PREVIOUS
    why = problem(latest)
    if not why:
        return latest, ""
    why_prev = problem(previous)
    if not why_prev:
        return previous, f"{latest}: {why}; resuming from the previous checkpoint, {previous}"
    raise CheckpointError(
        f"no usable checkpoint in {run_dir}: {latest.name}: {why}; {previous.name}: {why_prev}. "
        "Start the run anew (a new output-dir), or restore a checkpoint from a copy"
    )


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(run_dir: Path, arrays: dict[str, dict[str, np.ndarray]], state: dict[str, Any]) -> None:
    """`arrays`: named groups of numpy arrays (global model, momentum buffer, ...); `state`: JSON."""
    tensors = {
        f"{group}/{key}": torch.from_numpy(np.array(value, copy=True))
        for group, named in arrays.items()
        for key, value in named.items()
    }
    state = {**state, "tensor_groups": sorted(arrays)}
    tensors[STATE_KEY] = torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)
    latest, previous = run_dir / FILE, run_dir / PREVIOUS
    new = run_dir / f".{FILE}.new"
    _atomic_write(new, lambda f: torch.save(tensors, f))  # whole on disk before anything moves
    digest = _sha256(new).encode()
    if not problem(latest):  # keep the last good one (a corrupt one is overwritten below)
        # without a sidecar a checkpoint is checked by reading it: a crash between the renames
        # leaves the previous one readable, never a stale checksum beside it
        _sidecar(previous).unlink(missing_ok=True)
        os.replace(latest, previous)
        if _sidecar(latest).is_file():
            os.replace(_sidecar(latest), _sidecar(previous))
    _sidecar(latest).unlink(missing_ok=True)
    os.replace(new, latest)
    _atomic_write(_sidecar(latest), lambda f: f.write(digest + b"  " + FILE.encode() + b"\n"))


def load(
    run_dir: Path, file: Path | None = None
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """The arrays and state of `file`, by default the run's newest good checkpoint (`find`)."""
    if file is None:
        if not (run_dir / FILE).is_file() and not (run_dir / PREVIOUS).is_file():
            raise FileNotFoundError(
                f"no checkpoint {run_dir / FILE}; checkpoints are written every "
                "`checkpoint.every` rounds and at the end of a run"
            )
        file, _ = find(run_dir)
    flat = torch.load(file, map_location="cpu", weights_only=True)
    state = json.loads(bytes(flat.pop(STATE_KEY).tolist()).decode())
    arrays: dict[str, dict[str, np.ndarray]] = {g: {} for g in state["tensor_groups"]}
    for name, tensor in flat.items():
        group, key = name.split("/", 1)
        arrays[group][key] = tensor.numpy()
    return arrays, state

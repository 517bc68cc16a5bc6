"""Checkpoints that never unpickle arbitrary objects: one torch file of tensors, loaded with
`weights_only=True`; the non-tensor state is JSON stored in it as a byte tensor. The file is written
atomically (temporary file in the same directory, fsync, rename), so a crash leaves the previous
checkpoint whole.
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
STATE_KEY = "__state_json__"


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
    _atomic_write(run_dir / FILE, lambda f: torch.save(tensors, f))


def load(run_dir: Path) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    file = run_dir / FILE
    if not file.is_file():
        raise FileNotFoundError(
            f"no checkpoint {file}; checkpoints are written every "
            "`checkpoint.every` rounds and at the end of a run"
        )
    flat = torch.load(file, map_location="cpu", weights_only=True)
    state = json.loads(bytes(flat.pop(STATE_KEY).tolist()).decode())
    arrays: dict[str, dict[str, np.ndarray]] = {g: {} for g in state["tensor_groups"]}
    for name, tensor in flat.items():
        group, key = name.split("/", 1)
        arrays[group][key] = tensor.numpy()
    return arrays, state

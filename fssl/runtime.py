"""Per-process caches: a worker loads its dataset and partition once and reuses them every round."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import sys
from functools import lru_cache

import torch
from torch import nn

from .data import DataError, Dataset, load_dataset, read_client_file
from .methods import make_model
from .models import build_model
from .partition import Partition, partition_from_cfg
from .train import ClientData, client_data, to_nchw

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_threads(alone: bool = False) -> int:
    """CPU threads of a process that trains or evaluates on the CPU (the project's rule):
    OMP_NUM_THREADS where the user or the launcher set it (Ray sets it to the cores it reserved
    for a simulated client, `feddb sweep --jobs N` to cores / N, `feddb deploy local` to cores /
    nodes); else every core for a process that has the machine to itself (`alone`: a deployed
    SuperNode's worker), and one thread otherwise. On 2 cores one thread cost a lone run 15 %
    and saved it 6-13x when another process took a core (docs/speed.md, `feddb threads`):
    parallel work comes from processes, each on its share of the cores."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return cores() if alone else 1


def size_threads(device: torch.device, alone: bool = False) -> int | None:
    """Set this process's torch threads by `cpu_threads` when it computes on the CPU; the
    count, or None on an accelerator (its CPU threads only feed it)."""
    if device.type != "cpu":
        return None
    n = cpu_threads(alone)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Let glibc's malloc keep freed blocks for reuse instead of handing them back to the kernel.
    By default a tensor of a few MB (one batch's activations) is an mmap of its own, so every
    layer of every batch pays fresh page faults: measured on this project's 2-core VM, that made
    the central evaluation 1.3-2x slower and erratic. The cost is at most `trim_threshold` bytes
    of freed memory kept per malloc arena. Returns whether it applied (glibc only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(
            libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)
            and libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)
        )
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False


def _data_key(cfg: dict) -> str:
    keys = {
        "dataset": cfg["dataset"],
        "partition": cfg["partition"],
        "scenario": cfg.get("scenario"),
        "seed": cfg["seed"],
        "num_clients": cfg["fl"]["num_clients"],
    }
    return json.dumps(keys, sort_keys=True)


@lru_cache(maxsize=2)
def _dataset(dataset_json: str) -> Dataset:
    return load_dataset(json.loads(dataset_json))


def dataset_for(cfg: dict) -> Dataset:
    return _dataset(json.dumps(cfg["dataset"], sort_keys=True))


def check_data(cfg: dict) -> Dataset:
    """The dataset, once the configured model has taken one of its images: images too small for
    it (a 2x2 one through the CNN's two poolings) are refused before anything starts, not met as
    a traceback in the ServerApp."""
    ds = dataset_for(cfg)
    c, h, w = ds.image_shape
    model = build_model(cfg["model"], ds.num_classes, c, w).eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, c, h, w))
    except RuntimeError as err:
        raise DataError(
            f"dataset '{cfg['dataset']['name']}' has {h}x{w} images, too small for model "
            f"'{cfg['model']['name']}' ({str(err).splitlines()[0]}): use larger images or "
            "another model"
        ) from None
    return ds


@lru_cache(maxsize=2)
def _partition(key: str) -> Partition:
    cfg = json.loads(key)
    ds = _dataset(json.dumps(cfg["dataset"], sort_keys=True))
    full = {
        "dataset": cfg["dataset"],
        "partition": cfg["partition"],
        "scenario": cfg["scenario"],
        "seed": cfg["seed"],
        "fl": {"num_clients": cfg["num_clients"]},
    }
    return partition_from_cfg(full, ds.y_train, ds.num_classes)


def partition_for(cfg: dict) -> Partition:
    return _partition(_data_key(cfg))


def data_meta(ds: Dataset) -> dict:
    """What a client needs to know of the dataset without holding it."""
    return {
        "num_classes": ds.num_classes,
        "channels": ds.image_shape[0],
        "mean": list(ds.mean),
        "std": list(ds.std),
        "image_shape": list(ds.image_shape),
    }


_CLIENTS: dict[tuple, ClientData] = {}


def _file_key(path: str) -> str:
    try:
        info = os.stat(path)
    except OSError:
        return path  # read_client_file says what is wrong with it
    return f"{path}|{info.st_mtime_ns}|{info.st_size}"


def client_data_for(
    cfg: dict, pid: int, device: torch.device, own_file: str | None = None
) -> ClientData:
    """The client's labeled/unlabeled tensors, resident on `device`, built once per process:
    its partition of the dataset (simulation) or its own file (deployment)."""
    # a node's own file is keyed by its modification too: a resident worker outlives a run
    key = (_file_key(own_file) if own_file else _data_key(cfg), pid, str(device))
    if key not in _CLIENTS and own_file:
        a = read_client_file(own_file, cfg["data_meta"])
        _CLIENTS[key] = ClientData(
            to_nchw(a["x_labeled"], device),
            torch.from_numpy(a["y_labeled"]).to(device),
            to_nchw(a["x_unlabeled"], device),
            torch.from_numpy(a["y_unlabeled"]).to(device),
        )
    if key not in _CLIENTS:
        part = partition_for(cfg)
        if not 0 <= pid < part.num_clients:
            raise ValueError(f"partition-id {pid} is outside 0..{part.num_clients - 1}")
        _CLIENTS[key] = client_data(dataset_for(cfg), part, pid, device)
    return _CLIENTS[key]


_MODELS: dict[tuple, nn.Module] = {}


def model_for(cfg: dict, device: torch.device) -> nn.Module:
    """One model object per architecture and process, on `device`: each round loads the received
    state into it, so a worker builds (and, with train.compile, compiles) it once."""
    meta = cfg["data_meta"]
    key = (
        json.dumps([cfg["model"], cfg["method"]], sort_keys=True),
        meta["num_classes"],
        meta["channels"],
        str(device),
    )
    if key not in _MODELS:
        _MODELS[key] = make_model(cfg, meta["num_classes"], meta["channels"]).to(device)
    return _MODELS[key]

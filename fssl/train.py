"""What local training runs on, below the methods (fssl/methods/): a client's data on the
device, the round's seeds and learning rate, the pseudo-label weights' check, evaluation and the
device. The trainer base class is fssl/methods/base.py."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import augment
from .data import Dataset
from .models import batch_dependent
from .partition import Partition

CPU_EVAL_BATCH = 100  # images per CPU evaluation batch: activations that stay in cache


def no_grad_batch(model: nn.Module, x: torch.Tensor, batch_size: int) -> int:
    """Chunk size of a no-grad pass. On a CPU, a model whose outputs do not depend on the batch
    runs in cache-sized chunks: the same outputs to float rounding (tested; bit for bit on one
    thread on an AMD EPYC, not on an AVX-512 Xeon, whose kernels depend on the batch size), and
    1.7-1.9x faster for the CNN than chunks of 250-1024 images
    (measured, one thread)."""
    if x.device.type == "cpu" and not batch_dependent(model):
        return min(batch_size, CPU_EVAL_BATCH)
    return batch_size


@dataclass
class ClientData:
    x_l: torch.Tensor  # uint8 N_l x C x H x W, on the training device
    y_l: torch.Tensor
    x_u: torch.Tensor  # uint8 N_u x C x H x W (own labeled images included)
    y_u: torch.Tensor  # hidden true labels, used for metrics only


def to_nchw(x: np.ndarray, device: torch.device) -> torch.Tensor:
    """NHWC images as an NCHW tensor with NCHW strides (augment.nchw: with one channel numpy's
    transpose keeps channels-last strides)."""
    return augment.nchw(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))).to(device)


def client_data(ds: Dataset, part: Partition, pid: int, device: torch.device) -> ClientData:
    li, ui = part.labeled[pid], part.unlabeled[pid]
    return ClientData(
        to_nchw(ds.x_train[li], device),
        torch.from_numpy(ds.y_train[li]).to(device),
        to_nchw(ds.x_train[ui], device),
        torch.from_numpy(ds.y_train[ui]).to(device),
    )


def client_seed(seed: int, server_round: int, pid: int) -> int:
    """Seed of one client round; workers are reused in arbitrary order, so seed per task."""
    return int(np.random.SeedSequence([seed, server_round, pid]).generate_state(1)[0])


def cosine_lr(base: float, server_round: int, num_rounds: int, schedule: str) -> float:
    """Learning rate of round t (1-based): cosine annealing over the rounds, stepped per round."""
    if schedule == "constant":
        return base
    return base * 0.5 * (1 + math.cos(math.pi * (server_round - 1) / num_rounds))


def round_lr(cfg: dict, server_round: int) -> float:
    """The learning rate of round t: train.lr on train.lr_schedule over num_rounds."""
    tr = cfg["train"]
    return cosine_lr(tr["lr"], server_round, cfg["num_rounds"], tr["lr_schedule"])


def round_lambda_u(cfg: dict, server_round: int) -> float:
    """The unlabeled loss weight of round t: 0 during the warm-up rounds, lambda_u after."""
    tr = cfg["train"]
    return 0.0 if server_round <= tr["warmup_rounds"] else float(tr["lambda_u"])


def checked_targets(
    targets: torch.Tensor, mask: torch.Tensor, rows: int, num_classes: int, method: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A `select` hook's targets and mask as they are, once checked: hard labels (N, long) or
    per-image distributions (N x K float, non-negative rows summing to 1), and a mask (N, bool)
    or per-image weights (N, float in [0, 1]). Anything else is the method's error, named. One
    host sync where a value needs checking (soft targets, float weights), none otherwise."""
    soft = torch.is_floating_point(targets)
    if tuple(targets.shape) != ((rows, num_classes) if soft else (rows,)) or (
        not soft and targets.dtype != torch.long
    ):
        raise TypeError(
            f"{method}.select returned targets {targets.dtype}{list(targets.shape)} for {rows} "
            f"images: return hard labels (N, long) or per-image distributions (N x "
            f"{num_classes} float, rows summing to 1)"
        )
    weighted = torch.is_floating_point(mask)
    if tuple(mask.shape) != (rows,) or not (weighted or mask.dtype == torch.bool):
        raise TypeError(
            f"{method}.select returned a {mask.dtype}{list(mask.shape)} mask for {rows} images: "
            "return a bool mask or float weights in [0, 1], one per image"
        )
    checks = []
    if weighted:  # NaN fails both comparisons
        checks.append(~((mask >= 0) & (mask <= 1)).all())
    if soft:
        checks.append(~((targets >= 0).all(1) & ((targets.sum(1) - 1).abs() <= 1e-3)).all())
    bad = torch.stack(checks).tolist() if checks else []
    if weighted and bad[0]:
        raise ValueError(f"{method}.select returned weights outside [0, 1] (or NaN)")
    if soft and bad[-1]:
        raise ValueError(
            f"{method}.select returned soft targets with a negative (or NaN) entry or a row that "
            "does not sum to 1: normalise each image's distribution"
        )
    return targets, mask


def as_parts(extra: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The views of `unlabeled_batch`'s inputs: a tuple as it is, one tensor as one view."""
    return extra if isinstance(extra, tuple) else (extra,)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    mean: tuple,
    std: tuple,
    batch_size: int,
    fast: bool = False,
) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Loss, accuracy, predicted classes and their softmax confidence on fixed batches in dataset
    order (eval mode). `fast` (accelerators): bf16 autocast and channels_last, as training."""
    model.eval()
    if fast:
        model.to(memory_format=torch.channels_last)
    batch_size = no_grad_batch(model, x, batch_size)
    losses, preds, confs = [], [], []
    for i in range(0, len(x), batch_size):
        xb = augment.normalize(x[i : i + batch_size], mean, std)
        if fast:
            xb = xb.contiguous(memory_format=torch.channels_last)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=fast):
            logits = model(xb).float()
        losses.append(F.cross_entropy(logits, y[i : i + batch_size], reduction="sum"))
        conf, pred = F.softmax(logits, 1).max(1)
        preds.append(pred)
        confs.append(conf)
    pred = torch.cat(preds)
    return (
        float(torch.stack(losses).sum()) / len(y),
        float((pred == y).double().mean()),
        pred.cpu().numpy(),
        torch.cat(confs).cpu().double().numpy(),
    )


_COMPILED: dict[int, nn.Module] = {}


def compiled(model: nn.Module) -> nn.Module:
    """torch.compile of a model, once per model object (workers reuse one model per process)."""
    if id(model) not in _COMPILED:
        _COMPILED[id(model)] = torch.compile(model, dynamic=True)
    return _COMPILED[id(model)]


def resolve_device(name: str) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


@functools.cache
def client_device(name: str) -> torch.device:
    """resolve_device once a process for the ClientApp, which resolves it every round: each
    torch.cuda.is_available() counts the devices anew."""
    return resolve_device(name)

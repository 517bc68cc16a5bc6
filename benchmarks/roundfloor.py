"""A paper round's arithmetic floor on a GPU: its FLOPs, counted, against the GPU's measured rate
for the same model at the round's batch sizes (`feddb floor --paper-round`).

A round of `experiment=paper/<dataset>_<partition>` (WRN-28-2, E = 5 full-batch steps, APP-U as
Algorithm 2 prints it) is, per sampled client: one no-grad pass over its unlabeled pool (the
received model's pseudo-labels and APP-U), four more (APP-U of the models entering epochs 2-5),
and five training steps, each a forward and backward pass over its labeled images and the strong
views of its confident unlabeled ones; then the server's evaluation of the test set. Counted
twice: with every unlabeled image confident (the bench's round, an upper bound on a round's work),
and, given a run directory, with each round's clients as they were (their labeled and confident
counts in metrics.jsonl). The counts come from torch's FlopCounterMode on the meta device (shapes
only, nothing computed); the rate from timing the model's training step on the device.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

IMAGE = {"cifar10": (3, 32, 32), "cifar100": (3, 32, 32), "svhn": (3, 32, 32)}
CLASSES = {"cifar10": 10, "cifar100": 100, "svhn": 10}


def model_for(cfg: dict[str, Any], device: str):
    from fssl.methods import make_model

    name = cfg["dataset"]["name"]
    shape = IMAGE.get(name, (1, 28, 28))
    cfg = dict(cfg, data_meta={"image_shape": list(shape)})
    model = make_model(cfg, CLASSES.get(name, 10), shape[0])
    return model.to(device), shape


def step_flops(model, shape: tuple[int, ...], batch: int) -> float:
    """FLOPs of one training step (forward and backward) over `batch` images."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    meta = _on_meta(model)
    x = torch.empty(batch, *shape, device="meta")
    with FlopCounterMode(display=False) as counter:
        meta(x).sum().backward()
    return float(counter.get_total_flops())


def forward_flops(model, shape: tuple[int, ...], batch: int) -> float:
    """FLOPs of one no-grad forward pass over `batch` images."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    meta = _on_meta(model)
    x = torch.empty(batch, *shape, device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        meta(x)
    return float(counter.get_total_flops())


def _on_meta(model):
    import copy

    return copy.deepcopy(model).to("meta").train()


def client_flops(
    model, shape, n_labeled: int, n_pool: int, n_confident: int, epochs: int, passes: int
) -> float:
    """One client's round: `passes` no-grad passes over its pool and `epochs` training steps over
    its labeled images and its confident ones' strong views."""
    total = passes * forward_flops(model, shape, n_pool) if n_pool else 0.0
    batch = n_labeled + n_confident
    return total + (epochs * step_flops(model, shape, batch) if batch else 0.0)


def paper_round(cfg: dict[str, Any], n_labeled: int, n_pool: int, test_images: int) -> dict:
    """The round with every unlabeled image confident, for clients of `n_labeled` and `n_pool`
    images (the bench's: 40 and 500 on CIFAR-10)."""
    model, shape = model_for(cfg, "cpu")
    tr = cfg["train"]
    epochs = tr["local_epochs"]
    passes = epochs if cfg["app_u"].get("estimate") == "literal" else epochs + 1
    clients = round(cfg["fl"]["num_clients"] * cfg["fl"]["fraction_train"])
    per_client = client_flops(model, shape, n_labeled, n_pool, n_pool, epochs, passes)
    evaluation = forward_flops(model, shape, test_images)
    return {
        "clients": clients,
        "client": per_client,
        "evaluation": evaluation,
        "round": clients * per_client + evaluation,
        "step_batch": n_labeled + n_pool,
    }


def confident(client: dict[str, Any]) -> int:
    """A client's confident unlabeled images as its metrics.jsonl record has them: the record
    keeps the fraction (`pseudo_label_ratio`, None for a labels-only method), not the count."""
    if client.get("pseudo_label_count") is not None:
        return int(client["pseudo_label_count"])
    return round((client.get("pseudo_label_ratio") or 0.0) * client["num_unlabeled"])


def measured_rounds(run_dir: Path, cfg: dict[str, Any], test_images: int) -> dict:
    """Mean FLOPs of a run's rounds as they were: each client's labeled and confident counts."""
    model, shape = model_for(cfg, "cpu")
    epochs = cfg["train"]["local_epochs"]
    passes = epochs if cfg["app_u"].get("estimate") == "literal" else epochs + 1
    evaluation = forward_flops(model, shape, test_images)
    rounds = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    cache: dict[tuple, float] = {}
    totals = []
    for r in rounds:
        total = evaluation
        for c in r.get("clients", []):
            key = (c["num_labeled"], c["num_unlabeled"], confident(c))
            if key not in cache:
                cache[key] = client_flops(model, shape, *key, epochs, passes)
            total += cache[key]
        totals.append(total)
    return {"rounds": len(totals), "mean_round": sum(totals) / max(len(totals), 1)}


def step_rate(cfg: dict[str, Any], device: str, batch: int, repeat: int = 5) -> float:
    """FLOP/s of the model's training step at `batch` images on `device` (the best of three
    timings of `repeat` steps after a warm-up), in the precision the trainer uses there."""
    import torch

    model, shape = model_for(cfg, device)
    x = torch.randn(batch, *shape, device=device)
    bf16 = device.startswith("cuda")
    if bf16:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = model(x).float().sum()
        loss.backward()
        if bf16:
            torch.cuda.synchronize()

    return timed_rate(step, step_flops(model, shape, batch), repeat)


def timed_rate(step, flops: float, repeat: int) -> float:
    """FLOP/s of `step`, the best of three timings of `repeat` calls after a warm-up call."""
    step()
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            step()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return flops / best

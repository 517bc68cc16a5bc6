"""The method registry: local trainers by name and the model each method trains."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .fedmatch import FedMatchTrainer, decompose
from .models import build_model
from .semifl import SemiFL
from .train import FixMatch, LocalTrainer, Supervised

TRAINERS: dict[str, type[LocalTrainer]] = {
    "supervised": Supervised, "fixmatch": FixMatch, "semifl": SemiFL, "fedmatch": FedMatchTrainer}


def make_trainer(cfg: dict[str, Any], ds_mean: tuple, ds_std: tuple,
                 device: torch.device) -> LocalTrainer:
    name = cfg["method"]["trainer"]
    if name not in TRAINERS:
        raise ValueError(f"unknown trainer '{name}': choose {', '.join(TRAINERS)}")
    return TRAINERS[name](cfg, ds_mean, ds_std, device)


def make_model(cfg: dict[str, Any], num_classes: int, in_channels: int) -> nn.Module:
    """The configured model; FedMatch's weights decomposed into sigma + psi."""
    size = cfg.get("data_meta", {}).get("image_shape", [in_channels, 28, 28])[-1]
    model = build_model(cfg["model"], num_classes, in_channels, size)
    if cfg["method"]["trainer"] == "fedmatch":
        m = cfg["method"]
        decompose(model, m["psi_factor"], m["l1_thres"])
    return model

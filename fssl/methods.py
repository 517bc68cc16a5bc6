"""The method registry: each local trainer by name, where its code lives, and the check of the
method's own parameters (conf/method/*.yaml). Torch is imported only when a trainer or a model is
built, so that a launcher can check a configuration without it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .config import is_number, require

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .train import LocalTrainer


def _no_parameters(m: dict[str, Any]) -> None:
    """Supervised and FixMatch training take their parameters from `train`, none from `method`."""


def _check_semifl(m: dict[str, Any]) -> None:
    require(is_number(m.get("mix_alpha")) and m["mix_alpha"] > 0, "method.mix_alpha",
            m.get("mix_alpha"), "a number > 0")


def _check_fedmatch(m: dict[str, Any]) -> None:
    for key in ("lambda_s", "lambda_a", "lambda_i", "lambda_l1", "lambda_l2", "l1_thres"):
        require(is_number(m.get(key)) and m[key] >= 0, f"method.{key}", m.get(key),
                "a number >= 0")
    require(m.get("l2_reduction") in ("mean", "sum"), "method.l2_reduction",
            m.get("l2_reduction"), "mean, sum")
    require(is_number(m.get("psi_factor")) and m["psi_factor"] >= 0, "method.psi_factor",
            m.get("psi_factor"), "a number >= 0")
    for key in ("num_helpers", "helper_interval", "probe_size"):
        low = 0 if key == "num_helpers" else 1
        require(isinstance(m.get(key), int) and m[key] >= low, f"method.{key}", m.get(key),
                f"an integer >= {low}")
    require(m.get("view") in ("raw", "weak"), "method.view", m.get("view"), "raw, weak")


class Trainer(NamedTuple):
    target: str                                  # module:class of the LocalTrainer
    check: Callable[[dict[str, Any]], None]      # its own parameters under `method`


TRAINERS: dict[str, Trainer] = {
    "supervised": Trainer("fssl.train:Supervised", _no_parameters),
    "fixmatch": Trainer("fssl.train:FixMatch", _no_parameters),
    "semifl": Trainer("fssl.semifl:SemiFL", _check_semifl),
    "fedmatch": Trainer("fssl.fedmatch:FedMatchTrainer", _check_fedmatch),
}


def check_method(m: dict[str, Any]) -> None:
    """`method.trainer` is a registered trainer and the method's own parameters are valid."""
    require(m.get("trainer") in TRAINERS, "method.trainer", m.get("trainer"), ", ".join(TRAINERS))
    require(m.get("pseudo_labels", "round") in ("round", "online"), "method.pseudo_labels",
            m.get("pseudo_labels"), "round, online")
    TRAINERS[m["trainer"]].check(m)


def trainer_class(name: str) -> type[LocalTrainer]:
    if name not in TRAINERS:
        raise ValueError(f"unknown trainer '{name}': choose {', '.join(TRAINERS)}")
    module, _, cls = TRAINERS[name].target.partition(":")
    return getattr(importlib.import_module(module), cls)


def make_trainer(cfg: dict[str, Any], ds_mean: tuple, ds_std: tuple,
                 device: torch.device) -> LocalTrainer:
    return trainer_class(cfg["method"]["trainer"])(cfg, ds_mean, ds_std, device)


def make_model(cfg: dict[str, Any], num_classes: int, in_channels: int) -> nn.Module:
    """The configured model; FedMatch's weights decomposed into sigma + psi."""
    from .fedmatch import decompose
    from .models import build_model

    size = cfg.get("data_meta", {}).get("image_shape", [in_channels, 28, 28])[-1]
    model = build_model(cfg["model"], num_classes, in_channels, size)
    if cfg["method"]["trainer"] == "fedmatch":
        m = cfg["method"]
        decompose(model, m["psi_factor"], m["l1_thres"])
    return model

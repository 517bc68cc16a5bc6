"""The method registry: each local trainer by name, where its code lives, and the check of the
method's own parameters (conf/method/*.yaml). Torch is imported only when a trainer or a model is
built, so that a launcher can check a configuration without it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .config import boolean, choice, integer, number

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .train import LocalTrainer


def _no_parameters(m: dict[str, Any]) -> None:
    """Supervised and FixMatch training take their parameters from `train`, none from `method`."""


# The checks name each key from the configuration's root ({"method": m}); a parameter absent from
# `method` reads as null, which they refuse.
def _check_semifl(m: dict[str, Any]) -> None:
    number({"method": m}, "method.mix_alpha", low=0, open_low=True, default=None)
    boolean({"method": m}, "method.static_bn", default=False)


def _check_fedmatch(m: dict[str, Any]) -> None:
    cfg = {"method": m}
    number(
        cfg,
        "method.lambda_s",
        "method.lambda_a",
        "method.lambda_i",
        "method.lambda_l1",
        "method.lambda_l2",
        "method.l1_thres",
        "method.psi_factor",
        low=0,
        default=None,
    )
    choice(cfg, "method.l2_reduction", ("mean", "sum"), default=None)
    integer(cfg, "method.num_helpers", low=0, default=None)
    integer(cfg, "method.helper_interval", "method.probe_size", low=1, default=None)
    choice(cfg, "method.view", ("raw", "weak"), default=None)


class Trainer(NamedTuple):
    target: str  # module:class of the LocalTrainer
    check: Callable[[dict[str, Any]], None]  # its own parameters under `method`


TRAINERS: dict[str, Trainer] = {
    "supervised": Trainer("fssl.train:Supervised", _no_parameters),
    "fixmatch": Trainer("fssl.train:FixMatch", _no_parameters),
    "semifl": Trainer("fssl.semifl:SemiFL", _check_semifl),
    "fedmatch": Trainer("fssl.fedmatch:FedMatchTrainer", _check_fedmatch),
}


def check_method(m: dict[str, Any]) -> None:
    """`method.trainer` is a registered trainer and the method's own parameters are valid."""
    choice({"method": m}, "method.trainer", TRAINERS, default=None)
    choice({"method": m}, "method.pseudo_labels", ("round", "online"), default="round")
    TRAINERS[m["trainer"]].check(m)


def trainer_class(name: str) -> type[LocalTrainer]:
    if name not in TRAINERS:
        raise ValueError(f"unknown trainer '{name}': choose {', '.join(TRAINERS)}")
    module, _, cls = TRAINERS[name].target.partition(":")
    return getattr(importlib.import_module(module), cls)


def make_trainer(
    cfg: dict[str, Any], ds_mean: tuple, ds_std: tuple, device: torch.device
) -> LocalTrainer:
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

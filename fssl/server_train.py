"""The server's own training in scenario labels_at_server: the labeled split stays with the server,
which trains on it every round in the ServerApp, on its own device.

The server runs the method's supervised part with the clients' optimiser settings and the round's
learning rate, for `scenario.server_epochs` local epochs (default: train.local_epochs): labels-only
CE for every method, FedMatch's sigma step (lambda_s CE on the sigma side) for FedMatch. With
`method.static_bn` (SemiFL) and BatchNorm with running statistics (model.norm=bn), the model's
BatchNorm statistics are then recomputed on the server's labeled images (SemiFL's static BN, its
`sbn=0` variant: the server's data only, since clients' images never reach a real server).

When the server trains is the strategy's (strategy.base, `server_step`): after aggregation
(alternate training, SemiFL's; FedMatch's sigma step, as its official code opens each round;
FixMatch, FedDB and labels-only FedAvg too) or on the round's global model while the clients train
(FedRGD's grouped averaging).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from . import augment
from .data import Dataset
from .instruction import Instruction
from .methods import make_model, method_class
from .partition import Partition
from .train import ClientData, round_lr, to_nchw

SERVER_STREAM = 2**31 - 1  # the server's seed stream, apart from every client's partition id


def server_seed(seed: int, server_round: int) -> int:
    return int(np.random.SeedSequence([seed, server_round, SERVER_STREAM]).generate_state(1)[0])


@torch.no_grad()
def static_batchnorm(
    model: nn.Module, x: torch.Tensor, mean: tuple, std: tuple, batch_size: int
) -> int:
    """Recompute every BatchNorm's running statistics as the cumulative average over `x` (train
    mode, no augmentation, as SemiFL's make_batchnorm_stats); returns the layers recomputed."""
    layers = [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    if not layers:
        return 0
    momenta = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # cumulative average
    was_training = model.training
    model.train()
    for i in range(0, len(x), batch_size):
        model(augment.normalize(x[i : i + batch_size], mean, std))
    for m, momentum in zip(layers, momenta):
        m.momentum = momentum
    model.train(was_training)
    return len(layers)


class ServerLabels:
    """The server's labeled data and its training on them."""

    def __init__(
        self,
        cfg: dict[str, Any],
        ds: Dataset,
        part: Partition,
        device: torch.device,
        method: type | None = None,  # the method's class, where the caller resolved it
    ) -> None:
        idx = part.server
        x = to_nchw(ds.x_train[idx], device)
        y = torch.from_numpy(ds.y_train[idx]).to(device)
        self.data = ClientData(x, y, x, y)  # APP-U of a labels-only round reads x_u
        self.cfg = copy.deepcopy(cfg)
        epochs = (cfg.get("scenario") or {}).get("server_epochs")
        if epochs is not None:
            self.cfg["train"]["local_epochs"] = int(epochs)
        self.device = device
        self.mean, self.std = tuple(ds.mean), tuple(ds.std)
        method = method or method_class(cfg["method"]["trainer"])
        self.model = make_model(cfg, ds.num_classes, ds.image_shape[0], method).to(device)
        trainer = method.server_trainer()
        self.trainer = trainer(self.cfg, self.mean, self.std, device)
        self.static_bn = bool(cfg["method"].get("static_bn")) and cfg["model"]["norm"] == "bn"

    @property
    def size(self) -> int:
        return len(self.data.y_l)

    def train(self, server_round: int, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model `state` after the server's epochs on its labels in round `server_round`."""
        self.model.load_state_dict(state)
        seed = server_seed(self.cfg["seed"], server_round)
        lr = round_lr(self.cfg, server_round)
        instruction = Instruction(lr, seed, round=server_round, lambda_u=0.0)
        self.trainer.fit(self.model, self.data, instruction)
        if self.static_bn:
            static_batchnorm(
                self.model, self.data.x_l, self.mean, self.std, self.cfg["eval"]["batch_size"]
            )
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

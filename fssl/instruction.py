"""What a client is told for one round (`Instruction`), and the part of the run's configuration a
client builds its trainer, model and data from (`client_config`). The server-only sections (the
aggregation, DMA, robustness, differential privacy, logging, checkpoints, the strategy) never go
on the wire. strategy/contract.py puts both into a message and reads them back; no Flower here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The sections a client reads whole (its data, model, method and local training), and the one
# key it reads of two others: how many partitions there are, and its evaluation batch.
CLIENT_SECTIONS = (
    "seed",
    "device",
    "dpl",
    "dpl_prior",
    "dataset",
    "partition",
    "scenario",
    "model",
    "method",
    "train",
    "app_u",
    "data_meta",  # the dataset's classes, channels and normalisation, filled in by the ServerApp
)
CLIENT_KEYS = {"fl": ("num_clients",), "eval": ("batch_size",)}

# What FedProx (strategy=fedprox) puts in its instruction: the proximal term's mu.
PROXIMAL_MU = "proximal-mu"


def client_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The client's part of a resolved configuration."""
    out = {key: cfg[key] for key in CLIENT_SECTIONS if key in cfg}
    for section, keys in CLIENT_KEYS.items():
        out[section] = {k: cfg[section][k] for k in keys if k in cfg.get(section, {})}
    return out


@dataclass
class Instruction:
    """One client round: the learning rate and unlabeled loss weight of round `round`, the
    partition to train, what the method's server side sent besides the global model (`received`,
    named arrays: FedMatch's helpers), a strategy's client terms (`terms`: FedProx's
    `proximal-mu`), and the server's aggregated APP-U (`global_prior`, dpl_prior=global).
    `seed` seeds the round's random streams; the client derives it (it is not sent)."""

    lr: float
    seed: int = 0
    round: int = 1
    lambda_u: float | None = None  # None: train.lambda_u
    partition: int | None = None
    received: dict[str, dict[str, Any]] = field(default_factory=dict)
    terms: dict[str, Any] = field(default_factory=dict)
    global_prior: list[float] | None = None

    @property
    def proximal_mu(self) -> float:
        """FedProx's mu (0: no proximal term)."""
        return float(self.terms.get(PROXIMAL_MU, 0.0))

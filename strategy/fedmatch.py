"""FedMatch's server: uniform averaging of sigma and psi (with server momentum, or DMA weights when
`dma.enabled`), and helper selection (fssl.fedmatch describes the algorithm and its adaptations).

After each round the server rebuilds every valid upload theta_k = sigma_k + psi_k, embeds it (softmax
outputs on a fixed probe) and caches the embedding and psi_k, the latest per client. In rounds t with
t % helper_interval == 0, a sampled client that has an embedding gets, next to the global model, the
psi of its H nearest clients by a KD-tree over all cached embeddings, as ArrayRecords `helper_0`, ...
The caches are part of the strategy state, so checkpoints carry them.

labels_at_server (FedMatch's own variant): the clients hold no labels, so they train psi only; the
server trains sigma (and the other sigma-side arrays, psi held fixed) on its labels before the model
goes out, as the official code's `train_global_model()` opens each round, so the clients train psi
against the new sigma (`server_step = "alternate"`, the base class's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import MessageType

from fssl import fedmatch
from fssl.methods import make_model

from . import contract
from .base import ServerSetup, WeightedAverage
from .contract import numpy_to_arrays


class FedMatch(WeightedAverage):
    trainer = "fedmatch"  # its clients train decomposed models (sigma + psi)

    def __init__(
        self, cfg: dict[str, Any], num_classes: int, setup: ServerSetup | None = None
    ) -> None:
        super().__init__(cfg, num_classes, setup)
        meta = cfg["data_meta"]
        with torch.random.fork_rng(devices=[]):  # its weights are always loaded: leave the
            self.model = make_model(cfg, num_classes, meta["channels"])  # run's RNG alone
        self.probe = fedmatch.probe_images(
            cfg["seed"], cfg["method"]["probe_size"], tuple(meta["image_shape"])
        )
        self.embeddings: dict[int, np.ndarray] = {}
        self.psi: dict[int, dict[str, np.ndarray]] = {}

    def helpers_for(self, pid: int, server_round: int) -> list[int]:
        m = self.cfg["method"]
        if server_round % m["helper_interval"] != 0:
            return []
        return fedmatch.nearest_helpers(self.embeddings, pid, m["num_helpers"])

    def extra_records(self, pid: int, server_round: int, message_type: str) -> dict[str, Any]:
        if message_type != MessageType.TRAIN:
            return {}
        helpers = self.helpers_for(pid, server_round)
        if helpers:
            record = self.round_record
            record.helpers = {**(record.helpers or {}), str(pid): helpers}
        return {
            f"{contract.HELPER_PREFIX}{i}": numpy_to_arrays(self.psi[h])
            for i, h in enumerate(helpers)
        }

    def after_aggregate(self, server_round: int, parsed: list[dict[str, Any]]) -> None:
        meta = self.cfg["data_meta"]
        for p in parsed:
            pid = p["metrics"]["partition_id"]
            self.model.load_state_dict({k: torch.from_numpy(v) for k, v in p["arrays"].items()})
            self.embeddings[pid] = fedmatch.embedding(
                self.model, self.probe, tuple(meta["mean"]), tuple(meta["std"])
            )
            self.psi[pid] = {k: v.copy() for k, v in fedmatch.psi_state(p["arrays"]).items()}

    def state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        arrays, state = super().state()
        arrays["embeddings"] = {str(pid): v for pid, v in self.embeddings.items()}
        arrays.update({f"psi.{pid}": dict(v) for pid, v in self.psi.items()})
        return arrays, state

    def load_state(self, arrays: dict[str, dict[str, np.ndarray]], state: dict[str, Any]) -> None:
        super().load_state(arrays, state)
        self.embeddings = {int(pid): v for pid, v in arrays.get("embeddings", {}).items()}
        self.psi = {
            int(k.split(".", 1)[1]): dict(v) for k, v in arrays.items() if k.startswith("psi.")
        }

"""A user's strategy for `strategy=custom` (docs/strategies.md): Flower's FedAvg that weights each
client by its labeled images only, read from the reply metrics the project hands over, and keeps
a server learning rate of its own.

    PYTHONPATH=docs/examples .venv/bin/feddb local --run-config \
      "method='fixmatch' strategy='custom' num-server-rounds=3 output-dir='runs/my_strategy' \
       overrides='strategy.target=my_strategy:LabeledFedAvg +strategy.params.server_lr=0.8'"
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord
from flwr.serverapp.strategy import FedAvg


class LabeledFedAvg(FedAvg):
    def __init__(self, server_lr: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.server_lr = server_lr
        self.current: dict[str, np.ndarray] | None = None

    def configure_train(self, server_round, arrays, config, grid):
        self.current = {k: v.numpy() for k, v in arrays.items()}     # the round's global model
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = [r for r in replies if not r.has_error()]
        if not replies or self.current is None:
            return None, None
        metrics = [r.content["metrics"] for r in replies]
        weights = np.array([m["num_labeled"] for m in metrics], dtype=np.float64)
        weights /= weights.sum()
        new = {}
        for key, old in self.current.items():
            avg = sum(w * r.content["arrays"][key].numpy() for w, r in zip(weights, replies))
            new[key] = (old + self.server_lr * (avg - old)).astype(old.dtype)
        mean_loss = float(np.dot(weights, [m["train_loss"] for m in metrics]))
        return (ArrayRecord({k: Array(v) for k, v in new.items()}),
                MetricRecord({"train_loss": mean_loss}))

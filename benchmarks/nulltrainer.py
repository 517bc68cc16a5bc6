"""A method that computes nothing, loaded by path (`method='benchmarks.nulltrainer:NullTrainer'`): the
deployment benchmark's null trainer (benchmarks/deployoverhead.py). Its client returns the model it
received and a uniform APP-U without a step or a pass over its data, so a round of it is the
project's framework alone: the ClientApp, its set-up (configuration, model, received state,
data), the reply, the messages and the server's aggregation and recording."""

from __future__ import annotations

import time
from typing import Any

import torch

from fssl.methods.supervised import Supervised

SPEC = "benchmarks.nulltrainer:NullTrainer"


class NullTrainer(Supervised):
    """FedAvg's client and server without the computation: no step, no pass."""

    display = "null trainer"

    def fit(self, model, data, instruction, *args: Any, **kwargs: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        k = max(self.num_classes, int(data.y_l.max()) + 1 if len(data.y_l) else 1)
        self.momentum_out = {}
        uniform = [1.0 / k] * k
        return {
            "num_labeled": int(len(data.y_l)),
            "num_unlabeled": int(len(data.y_u)),
            "labeled_histogram": torch.bincount(data.y_l.cpu(), minlength=k).tolist(),
            "app_u": uniform,
            "app_u_global": uniform,
            "loss_sup": 0.0,
            "train_loss": 0.0,
            "loss_unsup": 0.0,
            "train_seconds": time.perf_counter() - t0,
        }

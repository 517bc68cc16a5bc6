"""Central evaluation of the global model (as Flower's quickstart keeps its `global_evaluate`):
when (every `eval.every` rounds, round 0 and the last), on what (the test set, and the
validation split when the dataset holds one), and the validation loss a candidate model gets in
the loss check of strategy/robust.py (the audit loss)."""

from __future__ import annotations

import copy
import queue
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from fssl.data import Dataset
from fssl.metrics import class_accuracy, prediction_stats
from fssl.record import Scores
from fssl.train import evaluate, to_nchw
from strategy.contract import arrays_to_torch


class GlobalEvaluation:
    """The server's model on the server's device, scored on the dataset's held-out splits."""

    def __init__(
        self, cfg: dict[str, Any], ds: Dataset, model: torch.nn.Module, device: torch.device
    ) -> None:
        self.cfg, self.ds, self.model = cfg, ds, model.to(device)
        self.batch_size = cfg["eval"]["batch_size"]
        self.x_test = to_nchw(ds.x_test, device)
        self.y_test = torch.from_numpy(ds.y_test).to(device)
        self.has_val = ds.x_val is not None and len(ds.x_val) > 0
        if self.has_val:
            self.x_val = to_nchw(ds.x_val, device)
            self.y_val = torch.from_numpy(ds.y_val).to(device)
        # on an accelerator the global model is evaluated as clients train: bf16, channels_last
        self.fast = device.type != "cpu" and cfg["train"]["precision"] in ("auto", "bf16")
        self.audit_models: queue.SimpleQueue[torch.nn.Module] = queue.SimpleQueue()

    def due(self, server_round: int) -> bool:
        """Round t's global model is evaluated: every `eval.every` rounds, round 0 and the last."""
        every = self.cfg["eval"].get("every", 1)
        return server_round % every == 0 or server_round >= self.cfg["num_rounds"]

    def scores(self, arrays: ArrayRecord) -> Scores:
        """Test loss, accuracy, class-wise accuracy, collapse signal and calibration; validation
        loss and accuracy when the dataset holds a validation split."""
        self.model.load_state_dict(arrays_to_torch(arrays))
        loss, acc, pred, conf = self.loss_and_accuracy(self.model, self.x_test, self.y_test)
        k = self.ds.num_classes
        out = Scores(
            test_accuracy=acc,
            test_loss=loss,
            class_accuracy=[float(v) for v in class_accuracy(pred, self.ds.y_test, k)],
            **prediction_stats(pred, conf, self.ds.y_test, k),
        )
        if self.has_val:
            out.val_loss, out.val_accuracy, _, _ = self.loss_and_accuracy(
                self.model, self.x_val, self.y_val
            )
        return out

    def loss_and_accuracy(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
        """(loss, accuracy, predictions, confidences) of `model` on images `x`, labels `y`."""
        return evaluate(model, x, y, self.ds.mean, self.ds.std, self.batch_size, self.fast)

    def audit_loss(self, arrays: dict[str, np.ndarray]) -> float:
        """Validation loss of a candidate global model on the split's first
        `server.robust.loss_check_size` images (the loss check of strategy/robust.py).
        Thread-safe: each call takes a model of its own from a pool (copies of the global one)."""
        n = self.cfg["server"]["robust"]["loss_check_size"]
        try:
            model = self.audit_models.get_nowait()
        except queue.Empty:
            model = copy.deepcopy(self.model)
        try:
            model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()})
            return self.loss_and_accuracy(model, self.x_val[:n], self.y_val[:n])[0]
        finally:
            self.audit_models.put(model)

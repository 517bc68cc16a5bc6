"""CBAFed (Li, Li, Wang, CVPR 2023, "Class Balanced Adaptive Pseudo Labeling for Federated
Semi-Supervised Learning"), as its official code (github minglllli/CBAFed) runs, for labeled and
unlabeled clients apart (scenario labels_at_partial_clients).

Clients: a labeled client trains `sup_epochs` (11) epochs on its labels from the received model,
with a local residual weight connection: its weights after epoch 0 are recorded, and after every
`sup_residual_every`-th (5th) epoch become `sup_residual_keep` (0.8) x record + 0.2 x weights, the
new record. An unlabeled client labels one weak view of each image once with the received model
(eval mode): label y kept where max p > tau_y; otherwise, when the second most likely class is one
the server calls rare (`second`), with that class. It trains by cross-entropy on exactly those weak
views (no new augmentation) and reports its kept labels' count and histogram; its lr is the
round's times `unsup_lr_scale` (their 0.02 / 0.03).

Server (`CBAFedServer`): the class shares p = the labeled clients' label counts plus the round's
kept pseudo-labels, normalised, times K/10; the next round's thresholds tau = min(p + `tau_base` -
std(p), `tau_cap`), rare classes p < `second_below`. Clients weigh by their kept pseudo-labels
(labeled clients: their labels). Every `residual_every`-th (5th) semi-supervised round the new
global model becomes `residual_keep` (1/2) x the one recorded 5 rounds before + the rest x the
aggregate, and is recorded. Departures: docs/methods/baselines.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import augment
from ..checks import ConfigError, choice, integer, number
from . import register
from .base import MethodServer
from .fixmatch import FixMatch


def warm(cfg: dict[str, Any], server_round: int) -> bool:
    return server_round <= cfg["train"]["warmup_rounds"]


def thresholds(counts: np.ndarray, m: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(tau per class, rare classes 0/1) from class counts (train_main.py:372-393)."""
    k = len(counts)
    p = counts / max(counts.sum(), 1) * k / 10
    tau = np.minimum(p + m["tau_base"] - np.std(p, ddof=1), m["tau_cap"])
    return tau.astype(np.float32), (p < m["second_below"]).astype(np.float32)


def clipped_histogram(hist: Any, k: int, most: int) -> np.ndarray:
    """A reply's class histogram, no longer than K, non-negative, summing to at most `most`."""
    h = np.clip(np.asarray(hist or [0] * k, dtype=np.float64)[:k], 0, None)
    h = np.pad(h, (0, k - len(h)))
    return h * min(1.0, most / h.sum()) if h.sum() > 0 else h


class CBAFedServer(MethodServer):
    own_aggregation = "pseudo-label-count weights and residual weight connection"

    def __init__(self, cfg: dict[str, Any], num_classes: int) -> None:
        super().__init__(cfg, num_classes)
        self.labeled: dict[int, np.ndarray] = {}  # pid -> its label histogram
        self.tau: dict[str, np.ndarray] = {}  # thresholds, second: the next round's
        self.record: dict[str, np.ndarray] = {}  # the residual's model

    def after_aggregate(self, server_round: int, parsed: list[dict[str, Any]]) -> None:
        k, counts = self.num_classes, np.zeros(self.num_classes)
        for p in parsed:
            n_l, n_u = p["sizes"]
            pid = p["metrics"]["partition_id"]
            if n_l > 0:
                self.labeled[pid] = clipped_histogram(p["metrics"]["labeled_histogram"], k, n_l)
            else:
                counts += clipped_histogram(p["metrics"].get("pseudo_label_histogram"), k, n_u)
        if server_round < self.cfg["train"]["warmup_rounds"]:
            return
        counts += sum(self.labeled.values(), np.zeros(k))
        tau, second = thresholds(counts, self.cfg["method"])
        self.tau = {"thresholds": tau, "second": second}
        self.notes.update(thresholds=tau.tolist(), second=np.flatnonzero(second).tolist())

    def records_for(self, pid: int, server_round: int) -> dict[str, dict[str, np.ndarray]]:
        return {} if warm(self.cfg, server_round) or not self.tau else {"cbafed": self.tau}

    def coefficients(
        self, server_round: int, replies: list[dict[str, Any]], weights: np.ndarray
    ) -> np.ndarray:
        if warm(self.cfg, server_round) or self.cfg["dma"]["enabled"]:
            return weights
        n = np.array(
            [
                n_l if n_l > 0 else min(int(r["metrics"].get("pseudo_label_count") or 0), n_u)
                for r, (n_l, n_u) in ((r, r["sizes"]) for r in replies)
            ],
            dtype=np.float64,
        )
        return n / n.sum() if n.sum() > 0 else n

    def after_update(
        self, server_round: int, old: dict[str, np.ndarray], new: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """The global residual weight connection (train_main.py:396-411)."""
        ssl_round = server_round - self.cfg["train"]["warmup_rounds"] - 1
        if ssl_round < 0:
            return new
        if ssl_round == 0 or not self.record:
            self.record = {k: v.copy() for k, v in old.items()}
        m = self.cfg["method"]
        if ssl_round > 0 and ssl_round % m["residual_every"] == 0:
            keep = m["residual_keep"]
            new = {
                k: (keep * self.record[k] + (1 - keep) * v).astype(v.dtype)
                if np.issubdtype(v.dtype, np.floating)
                else v
                for k, v in new.items()
            }
            self.record = {k: v.copy() for k, v in new.items()}
            self.notes["residual"] = True
        return new

    def state(self) -> dict[str, dict[str, np.ndarray]]:
        labeled = {str(pid): h for pid, h in self.labeled.items()}
        return {"cbafed_tau": self.tau, "cbafed_labeled": labeled, "cbafed_record": self.record}

    def load_state(self, arrays: dict[str, dict[str, np.ndarray]]) -> None:
        self.tau = dict(arrays.get("cbafed_tau", {}))
        self.labeled = {int(p): h for p, h in arrays.get("cbafed_labeled", {}).items()}
        self.record = dict(arrays.get("cbafed_record", {}))


@register("cbafed")
class CBAFed(FixMatch):
    display = "CBAFed"
    server = CBAFedServer
    scenarios = ("labels_at_partial_clients",)
    refuses = {
        "dp": "Flower's noise is sized for fl.fraction_train's clients a round, equally "
        "weighed, and CBAFed weighs a client by its kept labels (none: weight 0) and mixes an "
        "older model back in: set dp.mode=off",
    }

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        wrap = {"method": m}
        if choice(wrap, "method.pseudo_labels", ("round", "online"), default=None) == "online":
            raise ConfigError(
                "method.pseudo_labels=online with method cbafed: CBAFed trains on labels fixed "
                "once a round from the received model: set method.pseudo_labels=round"
            )
        for key in ("sup_epochs", "sup_residual_every", "residual_every"):
            integer(wrap, f"method.{key}", low=1, default=None)
        for key in ("tau_base", "tau_cap", "second_below", "sup_residual_keep", "residual_keep"):
            number(wrap, f"method.{key}", low=0, high=1, default=None)
        number(wrap, "method.unsup_lr_scale", low=0, open_low=True, default=None)
        integer(wrap, "method.pretrain_epochs", low=1, default=None, nullable="the warm-up's")

    def fit(self, model, data, instruction, client_state=None):
        m, self.labeled = self.cfg["method"], len(data.y_l) > 0
        # a labeled client's epochs: sup_epochs after the warm-up; pretrain_epochs (stage 1 of
        # their code) in a warm-up round, when set; either way with the local residual
        epochs = m["sup_epochs"] if instruction.lambda_u != 0 else m.get("pretrain_epochs")
        self.residual = self.labeled and epochs is not None
        self.tr = (
            {**self.cfg["train"], "local_epochs": epochs} if self.residual else self.cfg["train"]
        )
        self.epochs_done, self.kept_weights = 0, {}
        return super().fit(model, data, instruction, client_state)

    def make_optimizer(self, model, lr):
        return super().make_optimizer(
            model, lr if self.labeled else lr * self.cfg["method"]["unsup_lr_scale"]
        )

    def epoch(self, model, data, opt, prior):
        yield from super().epoch(model, data, opt, prior)
        if not self.residual:
            return
        e, m = self.epochs_done, self.cfg["method"]
        self.epochs_done += 1
        state = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
        if e > 0 and e % m["sup_residual_every"] == 0:
            keep = m["sup_residual_keep"]
            with torch.no_grad():
                for k, v in state.items():
                    v.mul_(1 - keep).add_(self.kept_weights[k], alpha=keep)
        if e == 0 or e % m["sup_residual_every"] == 0:
            self.kept_weights = {k: v.detach().clone() for k, v in state.items()}

    def weak_probs(self, model, data):
        self.last_weak = augment.weak(data.x_u, self.flip, self.gen)
        return self.predict(model, self.last_weak)

    def begin_round(self, model, data, probs_u, prior):
        self.fixed_x = self.last_weak  # the views the labels were made from (not re-augmented)
        return super().begin_round(model, data, probs_u, prior)

    def select(self, probs, idx, learn, raw=None):
        """Kept where max p > tau_y; else labelled with the second class where it is rare. Before
        the server has any class counts (no warm-up round): tau_cap for every class, none rare."""
        k = probs.shape[1]
        sent = self.received.get("cbafed") or {
            "thresholds": [self.cfg["method"]["tau_cap"]] * k,
            "second": [0.0] * k,
        }
        tau = torch.as_tensor(sent["thresholds"], device=probs.device, dtype=probs.dtype)
        second = torch.as_tensor(sent["second"], device=probs.device) > 0
        conf, top = probs.max(1)
        keep = conf > tau[top]
        runner_up = probs.scatter(1, top[:, None], 0.0).argmax(1)
        rare = ~keep & second[runner_up]
        return torch.where(rare, runner_up, top), keep | rare

    def unlabeled_count(self, data):
        return len(self.conf_idx)

    def unlabeled_batch(self, model, data, unl_idx, prior):
        fix = self.conf_idx if unl_idx is None else self.conf_idx[unl_idx]
        if len(fix) < 2:  # the official code skips a batch of one
            return None, 0, None
        target = self.pl_targets[fix]
        x = self.norm(self.fixed_x[fix])
        return x, len(fix), lambda logits: F.cross_entropy(logits, target)

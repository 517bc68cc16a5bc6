"""RSCFed (Liang et al., CVPR 2022, "RSCFed: Random Sampling Consensus Federated Semi-supervised
Learning"), as its official code (github xmed-lab/RSCFed) runs, for labeled and unlabeled clients
apart (scenario labels_at_partial_clients).

Clients: a labeled client trains on its labels (cross-entropy on weak views, the base path). An
unlabeled client trains its model (the student) against a mean teacher it keeps across rounds: per
step, two weak views of each image; the target is the teacher's prediction on the first,
sharpened with T (p^(1/T) renormalised); the loss is sum((softmax(student(view 2)) - target)^2)
over the batch's rows, times lambda_u (0.02); no confidence mask. After every step the teacher's
weights become alpha * teacher + (1 - alpha) * student, alpha = min(1 - 1/(i + 1), ema_decay), i
the client's steps so far (its first step copies the student). Its lr is the round's times
`unsup_lr_scale` (their 0.021 / 0.03).

Server (`RSCFedServer`): after the warm-up, each round draws M = `meta_round` subsets of K =
`meta_client_num` clients (seeded, independently) from the clients the round may sample and trains
their union. Each subset's replies make a sub-consensus model by distance reweighting: with q_k =
n_k / sum n over the subset, theta_bar = sum q_k theta_k, d_k = sum over arrays of
|theta_k - theta_bar|_2, s = `sup_scale` if the subset holds a labeled client, else `dist_scale`,
r_k = q_k exp(-s d_k / n_k), times `w_mul_times` for a labeled client, beta = r / sum r (computed in
log space). The global model is the mean of the sub-consensus models. Departures:
docs/methods/baselines.md.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import augment
from ..checks import integer, number
from . import register
from .base import LocalTrainer, MethodServer


def warm(cfg: dict[str, Any], server_round: int) -> bool:
    return server_round <= cfg["train"]["warmup_rounds"]


def subset_weights(
    arrays: list[dict[str, np.ndarray]],
    prior: np.ndarray,
    sizes: np.ndarray,
    labeled: np.ndarray,
    m: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray]:
    """One subset's distance-reweighted weights beta and the distances d_k (train_main.py:289-323
    of the official code, its "avg" branch): `prior` the clients' weights (renormalised here),
    `sizes` their n_k, `labeled` which hold labels."""
    q = prior / prior.sum() if prior.sum() > 0 else np.full(len(prior), 1 / len(prior))
    keys = [k for k, v in arrays[0].items() if np.issubdtype(v.dtype, np.floating)]
    mean = {k: sum(w * a[k].astype(np.float64) for w, a in zip(q, arrays)) for k in keys}
    dist = np.array(
        [sum(float(np.linalg.norm(a[k] - mean[k])) for k in keys) for a in arrays], dtype=float
    )
    scale = m["sup_scale"] if labeled.any() else m["dist_scale"]
    with np.errstate(divide="ignore"):  # q_k = 0: no weight
        log_r = np.log(q) - scale * dist / np.maximum(sizes, 1) + labeled * np.log(m["w_mul_times"])
    beta = np.exp(log_r - log_r.max())  # softmax: finite where exp(log_r) would underflow
    return beta / beta.sum(), dist


class RSCFedServer(MethodServer):
    own_aggregation = "random sub-consensus models with distance reweighting"

    def __init__(self, cfg: dict[str, Any], num_classes: int) -> None:
        super().__init__(cfg, num_classes)
        self.subsets: dict[int, list[list[int]]] = {}  # round -> its subsets (partition ids)

    def clients(self, server_round: int, pool: list[int], sampled: list[int]) -> list[int]:
        """After the warm-up, the union of M seeded subsets of K drawn from `pool`."""
        if warm(self.cfg, server_round):
            return sampled
        m = self.cfg["method"]
        rng = np.random.default_rng([self.cfg["seed"], server_round, 13])
        k = min(m["meta_client_num"], len(pool))
        subsets = [
            sorted(int(p) for p in rng.choice(pool, k, replace=False))
            for _ in range(m["meta_round"])
        ]
        self.subsets = {server_round: subsets}
        return sorted({p for s in subsets for p in s})

    def coefficients(
        self, server_round: int, replies: list[dict[str, Any]], weights: np.ndarray
    ) -> np.ndarray:
        subsets = self.subsets.get(server_round)
        if warm(self.cfg, server_round) or subsets is None:
            return weights
        pids = [r["metrics"]["partition_id"] for r in replies]
        labeled = np.array([r["sizes"][0] > 0 for r in replies])
        sizes = np.array([n_l if n_l > 0 else n_u for n_l, n_u in (r["sizes"] for r in replies)])
        out, notes = np.zeros(len(replies)), []
        for subset in subsets:
            idx = [i for i, p in enumerate(pids) if p in subset]
            if not idx:  # none of its clients replied
                continue
            beta, dist = subset_weights(
                [replies[i]["arrays"] for i in idx],
                weights[idx],
                sizes[idx].astype(float),
                labeled[idx],
                self.cfg["method"],
            )
            out[idx] += beta
            notes.append(
                {
                    "clients": [pids[i] for i in idx],
                    "beta": beta.tolist(),
                    "distance": dist.tolist(),
                }
            )
        out /= max(len(notes), 1)
        self.notes.update(subsets=notes, labeled_share=float(out[labeled].sum()))
        return out


@register("rscfed")
class RSCFed(LocalTrainer):
    uses_unlabeled = True
    display = "RSCFed"
    server = RSCFedServer
    scenarios = ("labels_at_partial_clients",)
    refuses = {
        "dpl": "RSCFed's unlabeled loss matches its client's own mean teacher's sharpened "
        "prediction, not pseudo-labels of the received model, which DPL debiases: drop dpl",
        "dma": "RSCFed's weights are its own (random subsets, distance-reweighted), and DMA's "
        "split into subsets would keep neither's: drop dma",
        "dp": "Flower's noise is sized for fl.fraction_train's clients a round, and RSCFed "
        "averages a random union of its subsets, a client weighed by each subset it is in: set "
        "dp.mode=off",
    }
    defaults = {"train.lambda_u": 0.02, "server.weighting": "samples"}

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        wrap = {"method": m}
        for key in ("meta_round", "meta_client_num"):
            integer(wrap, f"method.{key}", low=1, default=None)
        for key in ("w_mul_times", "sup_scale", "dist_scale", "sharpen_t", "unsup_lr_scale"):
            number(wrap, f"method.{key}", low=0, open_low=True, default=None)
        number(wrap, "method.ema_decay", low=0, high=1, default=None)

    def fit(self, model, data, instruction, client_state=None):
        self.labeled = len(data.y_l) > 0
        self.teacher, self.steps, self.alpha = None, 0, 0.0
        return super().fit(model, data, instruction, client_state)

    def make_optimizer(self, model, lr):
        return super().make_optimizer(
            model, lr if self.labeled else lr * self.cfg["method"]["unsup_lr_scale"]
        )

    def load_client_state(self, state):
        super().load_client_state(state)
        self.kept = state.get("rscfed", {})

    def begin_round(self, model, data, probs_u, prior):
        """The teacher: the one this client kept, or (its first round) the received model."""
        self.teacher = copy.deepcopy(model).eval().requires_grad_(False)
        kept = {k[len("teacher.") :]: v for k, v in self.kept.items() if k.startswith("teacher.")}
        if kept:
            self.teacher.load_state_dict(kept)
            self.steps = int(self.kept["step"])
        return {}

    def unlabeled_batch(self, model, data, unl_idx, prior):
        u = data.x_u if unl_idx is None else data.x_u[unl_idx]
        x_t = self.norm(augment.weak(u, self.flip, self.gen))
        x_s = self.norm(augment.weak(u, self.flip, self.gen))
        with torch.no_grad():
            p = F.softmax(self.forward(self.teacher, x_t), 1) ** (
                1 / self.cfg["method"]["sharpen_t"]
            )
            target = p / p.sum(1, keepdim=True)

        def loss_fn(logits: torch.Tensor) -> torch.Tensor:
            return (F.softmax(logits, 1) - target).square().sum() / len(u)

        return x_s, len(u), loss_fn

    def step(self, model, opt, data, lab_idx, unl_idx, prior):
        out = super().step(model, opt, data, lab_idx, unl_idx, prior)
        if self.teacher is not None and self.lambda_u > 0:
            alpha = min(1 - 1 / (self.steps + 1), self.cfg["method"]["ema_decay"])
            with torch.no_grad():
                for t, s in zip(self.teacher.parameters(), model.parameters()):
                    t.mul_(alpha).add_(s.detach(), alpha=1 - alpha)
            self.alpha, self.steps = alpha, self.steps + 1
        return out

    def client_state(self):
        state = super().client_state()
        if self.teacher is not None:
            teacher = {
                f"teacher.{k}": v.detach().cpu() for k, v in self.teacher.state_dict().items()
            }
            state["rscfed"] = {**teacher, "step": torch.tensor(self.steps)}
        return state

    def client_metrics(self):
        if self.teacher is None:
            return {}
        return {"teacher_steps": float(self.steps), "teacher_alpha": float(self.alpha)}

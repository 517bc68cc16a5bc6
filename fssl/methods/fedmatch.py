"""FedMatch (Jeong et al., ICLR 2021), labels-at-client, after the official TF2 code (wyjeong/FedMatch).

Pieces:
- Parameter decomposition: every Conv2d/Linear weight is theta = sigma + psi (a torch parametrization,
  so the model keeps its forward). Evaluation uses sigma + psi * 1[|psi| > l1_thres].
- Disjoint learning, per local step: a supervised step (lambda_s * CE on labeled data) updates sigma
  only; an unsupervised step updates psi only, with
  lambda_a * CE(agreement label, f(A(u_c))) + lambda_i * mean_h KL(p_h(u_c) || p_l(u_c))
  + lambda_l1 * sum|psi| + lambda_l2 * sum (sigma - psi)^2, where u_c are the samples on which the
  local model is confident. The L1/L2 terms apply even when no sample is confident (as the official code).
- Agreement pseudo-labels: one-hot votes of the local model and of each helper; ties go to the lowest
  class. Only the local model gates (max p_l >= tau).
- Helpers (server, `FedMatchServer`): each client's embedding is its model's softmax outputs on a
  fixed probe; every `helper_interval` rounds a returning client gets the psi of its H nearest
  neighbours (KD-tree over the latest embedding of every client seen) and rebuilds each helper as the
  received global model with that psi.

Adaptations to this project's models and scaffold (the official ResNet-9 has no normalisation or biases):
- Normalisation parameters (BN/GN affine), biases and BN running statistics are sigma-side: they are
  trained in the supervised step and averaged like every other array.
- Initialisation: sigma = w / (1 + psi_factor), psi = psi_factor * sigma, so theta equals the
  project's initial weights w (the official code draws sigma and sets psi = 0.2 sigma).
- The probe is `probe_size` noise images (truncated normal, mean 125, sd 125, clipped to [0, 255],
  normalised like the data) instead of one image: with batch-statistic BatchNorm a single image gives
  degenerate statistics. The embedding concatenates the per-image softmax outputs.
- Optimiser: the project's SGD (momentum, cosine lr, grad-norm clip per step) instead of plain SGD at
  1e-3 with per-client validation-based lr decay (which needs a validation set at every client).
  The sigma side keeps the project's weight decay; psi has none (the L1/L2 terms regularise it). The
  official Keras weight decay on the decomposed layers never reached the loss.
- Full-batch mode makes one supervised and one unsupervised step per local epoch; mini-batch mode uses
  the project's batch sizes. Pseudo-labels are always online (the current local model), as the original.
- The L2 term (sigma - psi)^2 is averaged over the psi values (`l2_reduction: mean`), not summed: at
  this project's lr and clip the official sum (lambda_l2 = 10) had a gradient about 1000x the
  unlabeled terms', so every psi step only pulled psi towards sigma (measured; docs/results.md).
- Labeled images and the pseudo-label/KL view are weak views (`view: weak`), not the official raw
  images (`view: raw`): with 100 labels raw images cost 1.0-2.5 points of validation accuracy
  (measured; docs/results.md).
- Sparse transport (delta/L1 thresholds on uploads) is not simulated: full arrays travel both ways.
- DPL (SPEC section 2): the local model's and the helpers' probabilities are both debiased with the
  client's APP-U before gating and voting (the bias removed is the local label prior); the KL targets
  stay un-debiased (DPL changes labels only).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from .. import augment
from ..checks import choice, integer, number
from ..sgd import SGD
from . import make_model, register
from .base import LocalTrainer, MethodServer
from .dpl import debias

HELPER_PREFIX = "helper_"  # the helpers' psi arrays go out as helper_0, helper_1, ...

SIGMA_SUFFIX = ".parametrizations.weight.original"
PSI_SUFFIX = ".parametrizations.weight.0.psi"


class SigmaPlusPsi(nn.Module):
    """Parametrization weight = sigma + psi (psi hard-thresholded in eval mode)."""

    def __init__(self, psi: torch.Tensor, l1_thres: float) -> None:
        super().__init__()
        self.psi = nn.Parameter(psi)
        self.l1_thres = l1_thres

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        if self.training:
            return sigma + self.psi
        return sigma + self.psi * (self.psi.abs() > self.l1_thres)


def decompose(model: nn.Module, psi_factor: float, l1_thres: float) -> nn.Module:
    """Decompose every Conv2d/Linear weight in place; the effective weights are unchanged."""
    for module in list(model.modules()):
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            with torch.no_grad():
                sigma = module.weight / (1.0 + psi_factor)
                module.weight.copy_(sigma)
            parametrize.register_parametrization(
                module, "weight", SigmaPlusPsi(psi_factor * sigma.clone(), l1_thres)
            )
    return model


def is_sigma(name: str) -> bool:
    return name.endswith(SIGMA_SUFFIX)


def is_psi(name: str) -> bool:
    return name.endswith(PSI_SUFFIX)


def decomposed_pairs(model: nn.Module) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """(sigma, psi) of every decomposed layer."""
    params = dict(model.named_parameters())
    return [
        (params[n], params[n[: -len(SIGMA_SUFFIX)] + PSI_SUFFIX]) for n in params if is_sigma(n)
    ]


def split_parameters(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(sigma side: sigma, norm affine, biases; psi side: psi)."""
    sigma_side, psi_side = [], []
    for name, p in model.named_parameters():
        (psi_side if is_psi(name) else sigma_side).append(p)
    if not psi_side:
        raise ValueError("the model is not decomposed: build it with fssl.methods.make_model")
    return sigma_side, psi_side


def regularisers(model: nn.Module, l2_reduction: str = "sum") -> tuple[torch.Tensor, torch.Tensor]:
    """sum |psi| and (sigma - psi)^2 over all decomposed layers, the latter summed (official) or
    averaged over the psi values (`l2_reduction: mean`, the default here: docs/methods.md, FedMatch)."""
    pairs = decomposed_pairs(model)
    l1 = sum(psi.abs().sum() for _, psi in pairs)
    l2 = sum((sigma - psi).pow(2).sum() for sigma, psi in pairs)
    if l2_reduction == "mean":
        l2 = l2 / sum(psi.numel() for _, psi in pairs)
    return l1, l2


def helper_models(model: nn.Module, helper_psi: list[dict[str, torch.Tensor]]) -> list[nn.Module]:
    """Each helper = the received model with its psi replaced by the helper's psi (eval mode)."""
    out = []
    for psi in helper_psi:
        h = copy.deepcopy(model)
        state = h.state_dict()
        unknown = sorted(set(psi) - {k for k in state if is_psi(k)})
        if unknown:
            raise ValueError(f"helper arrays {unknown[:3]} are not psi arrays of this model")
        state.update({k: v.to(state[k].device, state[k].dtype) for k, v in psi.items()})
        h.load_state_dict(state)
        h.eval().requires_grad_(False)
        out.append(h)
    return out


def agreement_labels(
    local_probs: torch.Tensor,
    helper_probs: list[torch.Tensor],
    tau: float,
    prior: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pseudo-labels by majority vote of the local model and the helpers (ties: lowest class) and
    the confidence mask of the local model; all probabilities debiased first when a prior is given."""
    if prior is not None:
        local_probs = debias(local_probs, prior, eps)
        helper_probs = [debias(p, prior, eps) for p in helper_probs]
    conf, local_labels = local_probs.max(dim=1)
    k = local_probs.shape[1]
    votes = F.one_hot(local_labels, k)
    for p in helper_probs:
        votes = votes + F.one_hot(p.argmax(dim=1), k)
    return votes.argmax(dim=1), conf >= tau


def probe_images(seed: int, n: int, shape: tuple[int, int, int]) -> torch.Tensor:
    """Fixed noise probe: truncated normal (mean 125, sd 125, |z| <= 2), clipped to [0, 255], uint8."""
    rng = np.random.default_rng([seed, 2021])
    z = rng.standard_normal((n, *shape))
    while (bad := np.abs(z) > 2).any():
        z[bad] = rng.standard_normal(int(bad.sum()))
    return torch.from_numpy(np.clip(125 + 125 * z, 0, 255).round().astype(np.uint8))


@torch.no_grad()
def embedding(model: nn.Module, probe: torch.Tensor, mean: tuple, std: tuple) -> np.ndarray:
    """The model's softmax outputs on the probe (eval mode), concatenated into one vector."""
    model.eval()
    return F.softmax(model(augment.normalize(probe, mean, std)).float(), 1).reshape(-1).numpy()


def nearest_helpers(embeddings: dict[int, np.ndarray], pid: int, h: int) -> list[int]:
    """The h clients whose embeddings are nearest to `pid`'s (Euclidean, KD-tree), nearest first;
    [] when `pid` has no embedding yet."""
    if pid not in embeddings or h <= 0 or len(embeddings) < 2:
        return []
    pids = sorted(embeddings)
    from scipy.spatial import cKDTree  # here: scipy.spatial costs 0.4 s of every start-up

    tree = cKDTree(np.stack([embeddings[p] for p in pids]))
    k = min(h + 1, len(pids))
    _, idx = tree.query(embeddings[pid], k=k)
    found = [pids[i] for i in np.atleast_1d(idx) if pids[i] != pid]
    return found[:h]


def psi_state(arrays: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in arrays.items() if is_psi(k)}


class FedMatchServer(MethodServer):
    """FedMatch's server: averaging of sigma and psi (with server momentum, or DMA weights when
    `dma.enabled`), and helper selection. After each round it rebuilds every valid upload
    theta_k = sigma_k + psi_k, embeds it (softmax outputs on a fixed probe) and caches the
    embedding and psi_k, the latest per client. In rounds t with t % helper_interval == 0, a
    sampled client that has an embedding gets the psi of its H nearest clients, next to the
    global model. The caches are part of the strategy state, so checkpoints carry them.

    labels_at_server (FedMatch's own variant): the clients hold no labels, so they train psi
    only; the server trains sigma (psi held fixed) on its labels before the model goes out, as the
    official code's `train_global_model()` opens each round (`step = "alternate"`)."""

    own_aggregation = "helpers for its clients"

    def __init__(self, cfg: dict[str, Any], num_classes: int) -> None:
        super().__init__(cfg, num_classes)
        meta = cfg["data_meta"]
        with torch.random.fork_rng(devices=[]):  # its weights are always loaded: leave the
            self.model = make_model(cfg, num_classes, meta["channels"])  # run's RNG alone
        self.probe = probe_images(
            cfg["seed"], cfg["method"]["probe_size"], tuple(meta["image_shape"])
        )
        self.embeddings: dict[int, np.ndarray] = {}
        self.psi: dict[int, dict[str, np.ndarray]] = {}

    def helpers_for(self, pid: int, server_round: int) -> list[int]:
        m = self.cfg["method"]
        if server_round % m["helper_interval"] != 0:
            return []
        return nearest_helpers(self.embeddings, pid, m["num_helpers"])

    def records_for(self, pid: int, server_round: int) -> dict[str, dict[str, np.ndarray]]:
        helpers = self.helpers_for(pid, server_round)
        if helpers:
            self.notes["helpers"] = {**(self.notes.get("helpers") or {}), str(pid): helpers}
        return {f"{HELPER_PREFIX}{i}": self.psi[h] for i, h in enumerate(helpers)}

    def after_aggregate(self, server_round: int, parsed: list[dict[str, Any]]) -> None:
        meta = self.cfg["data_meta"]
        for p in parsed:
            pid = p["metrics"]["partition_id"]
            self.model.load_state_dict({k: torch.from_numpy(v) for k, v in p["arrays"].items()})
            self.embeddings[pid] = embedding(
                self.model, self.probe, tuple(meta["mean"]), tuple(meta["std"])
            )
            self.psi[pid] = {k: v.copy() for k, v in psi_state(p["arrays"]).items()}

    def state(self) -> dict[str, dict[str, np.ndarray]]:
        arrays: dict[str, dict[str, np.ndarray]] = {
            "embeddings": {str(pid): v for pid, v in self.embeddings.items()}
        }
        arrays.update({f"psi.{pid}": dict(v) for pid, v in self.psi.items()})
        return arrays

    def load_state(self, arrays: dict[str, dict[str, np.ndarray]]) -> None:
        self.embeddings = {int(pid): v for pid, v in arrays.get("embeddings", {}).items()}
        self.psi = {
            int(k.split(".", 1)[1]): dict(v) for k, v in arrays.items() if k.startswith("psi.")
        }


@register("fedmatch")
class FedMatchTrainer(LocalTrainer):
    """Disjoint learning: a sigma step on labeled data, then a psi step on unlabeled data."""

    uses_unlabeled = True
    display = "FedMatch"
    server = FedMatchServer

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
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

    @classmethod
    def wrap_model(cls, model: nn.Module, m: dict[str, Any]) -> nn.Module:
        return decompose(model, m["psi_factor"], m["l1_thres"])

    @classmethod
    def server_trainer(cls) -> type[LocalTrainer]:
        return cls  # the server's sigma step on its labels (psi held fixed: lambda_u = 0)

    def make_optimizer(self, model: nn.Module, lr: float) -> SGD:
        self.sigma_side, self.psi_side = split_parameters(model)
        momentum = self.tr["momentum"]
        return SGD(
            [
                {"params": self.sigma_side, "weight_decay": self.tr["weight_decay"]},
                {"params": self.psi_side, "weight_decay": 0.0},
            ],
            lr=lr,
            momentum=momentum,
            nesterov=self.tr["nesterov"] and momentum > 0,
        )

    def view(self, x: torch.Tensor) -> torch.Tensor:
        """The view labels, pseudo-labels and KL use: raw images (official) or weak views."""
        return x if self.cfg["method"]["view"] == "raw" else augment.weak(x, self.flip, self.gen)

    def begin_round(self, model, data, probs_u, prior):
        helper_psi = [
            self.received[k] for k in sorted(self.received) if k.startswith(HELPER_PREFIX)
        ]
        self.helpers = helper_models(model, helper_psi)
        x = self.view(data.x_u)
        labels, mask = agreement_labels(
            self.predict(model, x),
            [self.predict(h, x) for h in self.helpers],
            self.tr["tau"],
            self.debias_prior(prior),
            self.cfg["app_u"]["eps"],
        )
        return {**self.label_stats(labels, mask, data), "num_helpers": len(self.helpers)}

    def _update(self, opt: SGD, loss: torch.Tensor, params: list[nn.Parameter]) -> None:
        """One optimiser step on `params` only (the others are frozen, so SGD skips them)."""
        trainable = {id(p) for p in params}
        for p in self.sigma_side + self.psi_side:
            p.requires_grad_(id(p) in trainable)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.tr["grad_clip"] > 0:
            nn.utils.clip_grad_norm_(params, self.tr["grad_clip"])
        opt.step()
        for p in self.sigma_side + self.psi_side:
            p.requires_grad_(True)

    def _freeze(self, params: list[nn.Parameter]) -> None:
        for p in params:
            p.requires_grad_(False)

    def step(self, model, opt, data, lab_idx, unl_idx, prior):
        ce = self.supervised_step(model, opt, data, lab_idx)
        if self.lambda_u == 0:  # warm-up round: the sigma step only
            return ce, torch.zeros((), device=ce.device)
        return ce, self.unsupervised_step(model, opt, data, unl_idx, prior)

    def supervised_step(
        self, model: nn.Module, opt: SGD, data, lab_idx: torch.Tensor
    ) -> torch.Tensor:
        """lambda_s * CE on labeled data; updates the sigma side only (psi frozen). A client
        without labels (labels at the server or at other clients) has no sigma step."""
        if len(lab_idx) == 0:
            return torch.zeros((), device=self.device)
        self._freeze(self.psi_side)
        ce = F.cross_entropy(
            self.forward(model, self.norm(self.view(data.x_l[lab_idx]))), data.y_l[lab_idx]
        )
        self._update(opt, self.cfg["method"]["lambda_s"] * ce, self.sigma_side)
        return ce.detach()

    def unsupervised_step(
        self, model: nn.Module, opt: SGD, data, unl_idx: torch.Tensor | None, prior: torch.Tensor
    ) -> torch.Tensor:
        """Agreement-label CE, inter-client KL and the L1/L2 terms; updates psi only."""
        m = self.cfg["method"]
        self._freeze(self.sigma_side)
        idx = torch.arange(len(data.y_u), device=self.device) if unl_idx is None else unl_idx
        u = data.x_u[idx]
        x = self.norm(self.view(u))
        with torch.set_grad_enabled(bool(self.helpers)):  # p_l needs a graph only for the KL
            logits_l = self.forward(model, x)
        with torch.no_grad():
            p_h = [F.softmax(self.forward(h, x), 1) for h in self.helpers]
        labels, mask = agreement_labels(
            F.softmax(logits_l.detach(), 1),
            p_h,
            self.tr["tau"],
            self.debias_prior(prior),
            self.cfg["app_u"]["eps"],
        )
        l1, l2 = regularisers(model, m["l2_reduction"])
        loss = m["lambda_l1"] * l1 + m["lambda_l2"] * l2
        conf = mask.nonzero(as_tuple=True)[0]
        if len(conf):  # host sync: the strong pass runs on confident samples only
            x_s = self.norm(augment.strong(u[conf], self.flip, self.gen))
            loss = loss + m["lambda_a"] * F.cross_entropy(self.forward(model, x_s), labels[conf])
            if p_h:
                log_p = F.log_softmax(logits_l[conf], 1)
                kl = sum(F.kl_div(log_p, p[conf], reduction="batchmean") for p in p_h) / len(p_h)
                loss = loss + m["lambda_i"] * kl
        self._update(opt, loss, self.psi_side)
        return loss.detach()

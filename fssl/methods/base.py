"""The trainer base class and the method's server side: what every method is (one class per
algorithm with small hooks, in the spirit of USB; the registry is fssl/methods/__init__.py).

`LocalTrainer.fit` runs one client round: APP-U of the received model over weak views of ALL the
client's unlabeled data, the method's round set-up (e.g. pseudo-labels), E local epochs, and the
momentum APP-U estimate p_bar <- gamma p_bar + (1 - gamma) p_bar^e (`app_u.estimate`: p_bar^e of
the model after epoch e's update, or Algorithm 2's model entering it). Every method ships APP-U.
DPL (fssl/methods/dpl.py) turns the probabilities a method labels from; DMA (fssl/methods/dma.py)
is on the server.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import augment
from ..instruction import PROXIMAL_MU, Instruction
from ..losses import app_u, momentum_update, pseudo_label
from ..sgd import SGD
from ..train import ClientData, as_parts, checked_targets, compiled, no_grad_batch
from . import dpl
from .estimates import SLOT, Estimates


class MethodServer:
    """A method's server side, without Flower: the strategy (strategy/base.py) asks it how to
    combine the round's clients, what each client receives besides the global model, and what
    it keeps. The base is plain averaging with nothing extra. `notes` is the round's record of
    what the method did (its keys go to metrics.jsonl)."""

    # labels_at_server: when the server trains on its labels. alternate: the aggregate, before it
    # goes out; parallel: the round's global model while the clients train, then `coefficients`
    # leaves the weight the clients do not take on that server model
    step = "alternate"
    # what it does that a Flower strategy (strategy=<name>) could not do in its place; None: it
    # does nothing a plain average lacks
    own_aggregation: str | None = None

    def __init__(self, cfg: dict[str, Any], num_classes: int) -> None:
        self.cfg, self.num_classes = cfg, num_classes
        self.notes: dict[str, Any] = {}

    def clients(self, server_round: int, pool: list[int], sampled: list[int]) -> list[int]:
        """The partitions the round trains: the strategy's draw `sampled` from `pool` (those the
        round may sample), or the method's own choice among `pool`."""
        return sampled

    def coefficients(
        self, server_round: int, replies: list[dict[str, Any]], weights: np.ndarray
    ) -> np.ndarray:
        """Each client's coefficient in the aggregate from the round's valid replies (`arrays`,
        `metrics`, `sizes` the server trusts each) and the weighting policy's `weights`; what they
        leave stays on the global (or server) model."""
        return weights

    def sits_out(self, metrics: dict[str, Any]) -> bool:
        """Whether a client's update leaves the aggregate (after the warm-up); the others share
        its weight."""
        return False

    def records_for(self, pid: int, server_round: int) -> dict[str, dict[str, np.ndarray]]:
        """Named arrays a client receives with its train instruction, besides the global model."""
        return {}

    def after_update(
        self, server_round: int, old: dict[str, np.ndarray], new: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """The global model to keep from the update's `new` (the round's entering one: `old`)."""
        return new

    def after_aggregate(self, server_round: int, parsed: list[dict[str, Any]]) -> None:
        """Caches built from the round's valid replies (arrays, metrics, app_u each)."""

    def state(self) -> dict[str, dict[str, np.ndarray]]:
        """Arrays a checkpoint keeps (merged into the strategy's)."""
        return {}

    def load_state(self, arrays: dict[str, dict[str, np.ndarray]]) -> None:
        pass


class TargetTally:
    """The pseudo-label figures of the targets training used, summed on the device as they are
    made (no host sync per step) and read once at the round's end: the ratio is the mean weight
    (with a mask, the share of kept images), the accuracy each target's correctness (hard: 1 or
    0; a distribution: its mass on the hidden true class) weighted by it, the count and the
    histogram (of each target's argmax) those of the rows with a weight above 0, and by true
    class those rows and those whose (argmax) label is right: with the histogram, each class's
    precision, with these its recall among them."""

    def __init__(self, num_classes: int, device: torch.device, truth_known: bool) -> None:
        self.rows, self.truth_known = 0, truth_known
        self.sums = torch.zeros(4, device=device)  # weight, kept, weight x correct, correct
        # kept rows by their label; by their true class; by true class, labelled right
        self.histogram, self.true, self.right = torch.zeros(3, num_classes, device=device)

    def add(self, targets: torch.Tensor, mask: torch.Tensor, truth: torch.Tensor) -> None:
        weights = mask.float()
        kept = (weights > 0).float()
        soft = targets.dim() == 2
        labels, truth = targets.argmax(1) if soft else targets, truth.clamp_min(0)
        self.histogram.index_add_(0, labels, kept)
        self.true.index_add_(0, truth, kept)
        self.right.index_add_(0, truth, kept * (labels == truth).float())
        if soft:
            correct = targets.gather(1, truth[:, None]).squeeze(1).float()
        else:
            correct = (targets == truth).float()
        sums = [weights.sum(), kept.sum(), (correct * weights).sum(), correct.sum()]
        self.sums += torch.stack(sums)
        self.rows += len(weights)

    def figures(self) -> dict[str, Any]:
        weight, kept, weighted, correct = self.sums
        n_kept = int(kept)
        out = {
            "pseudo_label_ratio": float(weight) / max(self.rows, 1),
            "pseudo_label_count": n_kept,
            "pseudo_label_histogram": [int(c) for c in self.histogram.tolist()],
        }
        if self.truth_known:  # hidden labels known (simulation, exported files)
            out["pseudo_label_accuracy"] = float(weighted / weight) if n_kept else 0.0
            out["pseudo_label_accuracy_all"] = float(correct / self.rows) if self.rows else 0.0
            out["pseudo_label_class_true"] = [int(c) for c in self.true.tolist()]
            out["pseudo_label_class_correct"] = [int(c) for c in self.right.tolist()]
        return out


class LocalTrainer:
    """Base of every method (fssl/methods/): supervised loss on labeled weak views; a method
    subclasses it, registers with `fssl.methods.register`, and adds the unlabeled part through
    the hooks below. The class-level API (`check_params`, `wrap_model`, `server_trainer`,
    `server`, `display`) is what the framework asks of a method instead of its name."""

    uses_unlabeled = False
    display = "labels only"  # how reports name it
    # `method.*` values the method's YAML leaves out (a method given by path has none), e.g.
    # {"pseudo_labels": "online", "ema": 0.97}, and dotted keys its YAML could set, e.g.
    # {"train.tau": 0.8} (experiment presets and the command line win); `method.<key>=` wins
    defaults: dict[str, Any] = {}
    server: type[MethodServer] = MethodServer  # the method's server side: plain averaging
    proximal_mu = 0.0  # FedProx's mu for the round (the instruction's `proximal-mu`)
    # names of the running estimates a client keeps across its rounds (fssl/methods/estimates.py),
    # in `self.estimates`: saved and restored with the client state, e.g. ("q_hat",)
    keeps: tuple[str, ...] = ()
    # the scenarios the method is defined for (None: all), and a one-line refusal of a switch
    # that cannot act on it ("dpl", "dma", "dp": the reason and the fix), read by fssl/config.py
    scenarios: tuple[str, ...] | None = None
    refuses: dict[str, str] = {}

    # -- the class-level API ---------------------------------------------------------------
    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        """Check the method's own parameters under `method` (conf/method/<name>.yaml) with
        fssl.checks' rules; none here."""

    @classmethod
    def kept_between_rounds(cls, cfg: dict[str, Any]) -> list[str]:
        """What this method's clients keep on their nodes from round to round, in words (empty:
        nothing). A checkpoint that does not hold it cannot continue the run as it would have
        gone on (feddb/launch.py: check_resume)."""
        kept = [f"estimates ({', '.join(cls.keeps)})"] if cls.keeps else []
        if cfg["train"]["optimizer_state"] == "client":
            kept.append("SGD momentum (train.optimizer_state=client)")
        if cls.client_state is not LocalTrainer.client_state:
            kept.append(f"{cls.display}'s own client state")
        return kept

    @classmethod
    def wrap_model(cls, model: nn.Module, m: dict[str, Any]) -> nn.Module:
        """The model as the method trains it (FedMatch: weights decomposed into sigma + psi)."""
        return model

    @classmethod
    def server_trainer(cls) -> type[LocalTrainer]:
        """The class that trains on the server's labels (labels_at_server): labels-only
        training of the method's model."""
        return LocalTrainer

    def __init__(self, cfg: dict[str, Any], ds_mean: tuple, ds_std: tuple, device: torch.device):
        self.cfg, self.tr = cfg, cfg["train"]
        self.mean, self.std, self.device = ds_mean, ds_std, device
        self.flip = bool(cfg["dataset"]["flip"])
        self.global_prior: torch.Tensor | None = None  # dpl_prior=global: sent with the model
        accel = device.type != "cpu"
        self.bf16 = self.tr["precision"] == "bf16" or (self.tr["precision"] == "auto" and accel)
        cl = self.tr["channels_last"]
        self.channels_last = cl is True or (cl == "auto" and accel)
        self.compiled: nn.Module | None = None
        self.tally: TargetTally | None = None  # a round's pseudo-label figures (count_targets)
        self.num_classes = cfg.get("data_meta", {}).get("num_classes", 0)  # fit: from APP-U
        self.estimates = Estimates(self.keeps, device)

    # -- helpers ---------------------------------------------------------------------------
    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return augment.normalize(x, self.mean, self.std)

    def forward(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Logits in fp32; bf16 autocast and channels_last when enabled (on CUDA by default), the
        compiled model when `train.compile` (for the model being trained)."""
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        net = self.compiled if self.compiled is not None and model is self.model else model
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return net(x).float()

    @torch.no_grad()
    def predict(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Softmax probabilities of a no-grad pass in fixed chunks (model in eval mode)."""
        was_training = model.training
        model.eval()
        bs = no_grad_batch(model, x, self.tr["infer_batch_size"])
        out = torch.cat(
            [
                F.softmax(self.forward(model, self.norm(x[i : i + bs])), 1)
                for i in range(0, len(x), bs)
            ]
        )
        model.train(was_training)
        return out

    def weak_probs(self, model: nn.Module, data: ClientData) -> torch.Tensor:
        return self.predict(model, augment.weak(data.x_u, self.flip, self.gen))

    def new_tally(self, data: ClientData) -> TargetTally:
        return TargetTally(self.num_classes, data.y_u.device, bool((data.y_u >= 0).all()))

    def count_targets(
        self, targets: torch.Tensor, mask: torch.Tensor, idx: torch.Tensor, data: ClientData
    ) -> None:
        """Add targets that train (of the unlabeled images `idx`) to the round's pseudo-label
        figures (`TargetTally`), which fit reports."""
        if self.tally is None:
            self.tally = self.new_tally(data)
        self.tally.add(targets, mask, data.y_u[idx])

    def label_stats(
        self, targets: torch.Tensor, mask: torch.Tensor, data: ClientData
    ) -> dict[str, Any]:
        """The pseudo-label figures (`TargetTally`) of one set of targets for all unlabeled
        images: hard labels or distributions, with a mask or per-image weights."""
        tally = self.new_tally(data)
        tally.add(targets, mask, data.y_u)
        return tally.figures()

    def debias_prior(self, prior: torch.Tensor) -> torch.Tensor | None:
        """What DPL divides this client's pseudo-labels by, or None (fssl/methods/dpl.py)."""
        return dpl.prior_for(self.cfg, prior, self.global_prior)

    def pseudo_labels(
        self,
        probs: torch.Tensor,
        prior: torch.Tensor,
        idx: torch.Tensor | None = None,
        learn: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pseudo-label targets (hard labels or distributions) and their mask or weights for
        weak-view probabilities `probs` of the unlabeled images `idx`: DPL first (so a method
        sharpens or thresholds the debiased distribution), then the method's `select`, checked.
        `learn`: the targets train the model, so a method may update what it tracks."""
        debias_by = self.debias_prior(prior)
        raw = probs
        if debias_by is not None:
            probs = dpl.debias(probs, debias_by, self.cfg["app_u"]["eps"])
        targets, mask = self.select(probs, idx, learn, raw)
        return checked_targets(targets, mask, len(probs), probs.shape[1], type(self).__name__)

    def select(
        self,
        probs: torch.Tensor,
        idx: torch.Tensor | None,
        learn: bool,
        raw: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pseudo-labelling rule (a hook): from `probs` (N x K, DPL-debiased when DPL is on;
        `raw`: the model's own probabilities, which a method's estimates of the model track;
        None: `probs` are raw) of the unlabeled images `idx` (None: all of them), the targets,
        hard labels (N, long) or per-image distributions (N x K float, rows summing to 1: soft
        targets, UDA's), and either a mask (N, bool: which targets train) or per-image weights
        (N, float in [0, 1]: how much each target's loss counts, SoftMatch's). `learn`: these
        targets train the model, so the method may update what it tracks (per image: by `idx`).
        Here argmax labels, kept where max p >= tau."""
        return pseudo_label(probs, self.tr["tau"])

    def labels_only(self, data: ClientData) -> bool:
        """A labeled client of labels_at_partial_clients trains on its labels alone (it holds no
        unlabeled image: its unlabeled set is its own labeled images)."""
        scenario = (self.cfg.get("scenario") or {}).get("name", "labels_at_clients")
        return scenario == "labels_at_partial_clients" and len(data.y_l) > 0

    # -- hooks -----------------------------------------------------------------------------
    def make_optimizer(self, model: nn.Module, lr: float) -> SGD:
        return SGD(
            model.parameters(),
            lr=lr,
            momentum=self.tr["momentum"],
            nesterov=self.tr["nesterov"] and self.tr["momentum"] > 0,
            weight_decay=self.tr["weight_decay"],
        )

    def begin_round(
        self, model: nn.Module, data: ClientData, probs_u: torch.Tensor, prior: torch.Tensor
    ) -> dict[str, float]:
        """Called once a round before the local epochs, with the received model's weak-view
        probabilities and APP-U; not in warm-up rounds (lambda_u = 0: labels only, no hook of
        the unlabeled part runs). Returns figures for the round's record."""
        return {}

    def load_client_state(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """What this client kept from its last round (`client_state`), before the round; a
        client's first round gets {}. Here its estimates (`keeps`), on the device."""
        self.estimates.restore(state.get(SLOT, {}))

    def client_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """What the client keeps for its next round, by name (tensors; the ClientApp stores
        them in Flower's context.state, so simulation and deployment alike). The base keeps the
        method's estimates (`keeps`) and the SGD momentum when `train.optimizer_state: client`
        (the authors' code)."""
        out = {"optimizer": self.momentum_out} if self.tr["optimizer_state"] == "client" else {}
        estimates = self.estimates.saved()
        if estimates:  # a client that has started none keeps no slot
            out[SLOT] = estimates
        return out

    def client_metrics(self) -> dict[str, float]:
        """The method's own figures of this client's round (a hook, after every round, warm-up
        ones included): up to 16 names (letters, digits, `_`, `.`, `-`) to numbers, kept per
        client in metrics.jsonl (`method`) and averaged in `feddb report`'s tables. None here."""
        return {}

    def unlabeled_count(self, data: ClientData) -> int:
        """Size of the unlabeled pool a mini-batch epoch iterates over."""
        return len(data.y_u)

    # -- the round -------------------------------------------------------------------------
    def prepare(
        self,
        model: nn.Module,
        lr: float,
        seed: int,
        received: dict[str, dict[str, torch.Tensor]] | None = None,
        client_state: dict[str, dict[str, torch.Tensor]] | None = None,
    ) -> SGD:
        """Seed the round's random streams, put the model on the device in its memory format
        (compiled when asked) and return its optimiser, its momentum buffers from the client's
        state when it keeps them."""
        torch.manual_seed(seed)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.rng = np.random.default_rng(seed)  # host-side draws (e.g. mixup lambda)
        self.received = received or {}
        self.tally = None  # a new round's figures
        client_state = client_state or {}
        self.load_client_state(client_state)
        momentum = client_state.get("optimizer") if self.tr["optimizer_state"] == "client" else None
        model.to(self.device).train()
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        self.model = model
        self.compiled = compiled(model) if self.tr["compile"] else None
        opt = self.make_optimizer(model, lr)
        params = dict(model.named_parameters())
        for name, buf in (momentum or {}).items():
            if name in params and buf.shape == params[name].shape:
                opt.state[params[name]]["momentum_buffer"] = buf.to(self.device, torch.float32)
        return opt

    def fit(
        self,
        model: nn.Module,
        data: ClientData,
        instruction: Instruction,
        client_state: dict[str, dict[str, torch.Tensor]] | None = None,
    ) -> dict[str, Any]:
        """One client round as `instruction` says (fssl/instruction.py: its learning rate, seed,
        unlabeled loss weight, what the method's server side sent, a strategy's client terms, the
        server's APP-U); `client_state`: what this client kept from its last round
        (`client_state()` gives the next). A `lambda_u` of 0 (the server's warm-up) trains on
        the labels alone."""
        t0 = time.perf_counter()
        sent = instruction.global_prior
        self.global_prior = (
            torch.tensor(sent, dtype=torch.float32, device=self.device)
            if sent is not None
            else None
        )
        lambda_u = instruction.lambda_u
        self.lambda_u = self.tr["lambda_u"] if lambda_u is None else float(lambda_u)
        if self.labels_only(data):
            self.lambda_u = 0.0
        opt = self.prepare(
            model, instruction.lr, instruction.seed, instruction.received, client_state
        )
        self.begin_terms(model, instruction.terms)
        params = dict(model.named_parameters())
        gamma = self.cfg["app_u"]["gamma"]
        probs0 = self.weak_probs(model, data)
        prior0 = app_u(probs0)
        self.num_classes = len(prior0)
        metrics = self.begin_round(model, data, probs0, prior0) if self.lambda_u > 0 else {}
        prior, sup_losses, unsup_losses = prior0.clone(), [], []
        after_update = self.cfg["app_u"].get("estimate", "local") == "local"
        for epoch in range(self.tr["local_epochs"]):
            # Algorithm 2 as printed (`literal`) averages p_bar^e of the model *entering* epoch e,
            # so the last local model never enters the estimate, and with one epoch (the CPU
            # presets) the shipped APP-U is the received model's: DMA would weigh data mixes,
            # not the local models it averages. `local` takes p_bar^e after epoch e's update.
            if not after_update:
                epoch_probs = probs0 if epoch == 0 else self.weak_probs(model, data)
            for ls, lu in self.epoch(model, data, opt, prior):
                sup_losses.append(ls)
                unsup_losses.append(lu)
            if after_update:
                epoch_probs = self.weak_probs(model, data)
            prior = momentum_update(prior, app_u(epoch_probs), gamma)
        self.momentum_out = {
            n: opt.state[p]["momentum_buffer"].detach().cpu()
            for n, p in params.items()
            if opt.state.get(p, {}).get("momentum_buffer") is not None
        }
        metrics.update(
            {
                "num_labeled": int(len(data.y_l)),
                "num_unlabeled": int(len(data.y_u)),
                "labeled_histogram": torch.bincount(data.y_l, minlength=len(prior0)).tolist(),
                "app_u": prior.cpu().double().tolist(),
                "app_u_global": prior0.cpu().double().tolist(),
                "loss_sup": float(torch.stack(sup_losses).mean()) if sup_losses else 0.0,
                # the received model's labeled loss (its first step's): q-FFL's F_k(w_t) (QFedAvg)
                "train_loss": float(sup_losses[0]) if sup_losses else 0.0,
                "loss_unsup": float(torch.stack(unsup_losses).mean()) if unsup_losses else 0.0,
                "train_seconds": time.perf_counter() - t0,
            }
        )
        if self.tally is not None:  # read once, at the round's end
            metrics.update(self.tally.figures())
        own = self.client_metrics()
        if own:
            metrics["method"] = {str(k): float(v) for k, v in own.items()}
        return metrics

    def epoch(self, model: nn.Module, data: ClientData, opt: SGD, prior: torch.Tensor):
        """One local epoch; yields (supervised loss, unlabeled loss) per optimiser step, as
        detached tensors (read once after the round: no host sync per step)."""
        if self.tr["mode"] == "fullbatch":
            yield self.step(
                model, opt, data, torch.arange(len(data.y_l), device=self.device), None, prior
            )
            return
        bs = self.tr["batch_size"]
        semi = self.uses_unlabeled and self.lambda_u > 0
        n_l, n_u = len(data.y_l), self.unlabeled_count(data) if semi else 0
        ubs = bs * self.tr["mu"]
        steps = self.tr["local_steps"] or (math.ceil(n_u / ubs) if n_u else math.ceil(n_l / bs))
        lab = self._cycle(n_l, steps * min(bs, n_l))
        unl = self._cycle(n_u, steps * min(ubs, n_u))
        lb, ub = min(bs, n_l), min(ubs, n_u)
        for s in range(steps):
            yield self.step(
                model, opt, data, lab[s * lb : (s + 1) * lb], unl[s * ub : (s + 1) * ub], prior
            )

    def _cycle(self, n: int, total: int) -> torch.Tensor:
        if n == 0 or total == 0:
            return torch.empty(0, dtype=torch.long, device=self.device)
        reps = math.ceil(total / n)
        perms = [torch.randperm(n, generator=self.gen, device=self.device) for _ in range(reps)]
        return torch.cat(perms)[:total]

    def step(
        self,
        model: nn.Module,
        opt: SGD,
        data: ClientData,
        lab_idx: torch.Tensor,
        unl_idx: torch.Tensor | None,
        prior: torch.Tensor,
    ) -> tuple[float, float]:
        n_l = len(lab_idx)  # 0: a client without labels (labels at the server or at others)
        x_l = self.norm(augment.weak(data.x_l[lab_idx], self.flip, self.gen)) if n_l else None
        extra, n_extra, loss_u_fn = (
            self.unlabeled_batch(model, data, unl_idx, prior)
            if self.lambda_u > 0
            else (None, 0, None)
        )
        zero = torch.zeros((), device=self.device)
        if not n_l and not n_extra:  # nothing to learn from in this step
            return zero, zero
        parts = ([x_l] if n_l else []) + (list(as_parts(extra)) if n_extra else [])
        logits = self.forward_parts(model, parts)
        loss_s = F.cross_entropy(logits[:n_l], data.y_l[lab_idx]) if n_l else zero
        loss_u = loss_u_fn(logits[n_l:]) if loss_u_fn is not None else None
        loss = loss_s + self.lambda_u * loss_u if loss_u is not None else loss_s
        term = self.client_term(model)
        if term is not None:
            loss = loss + term
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.tr["grad_clip"] > 0:
            nn.utils.clip_grad_norm_(model.parameters(), self.tr["grad_clip"])
        opt.step()
        return loss_s.detach(), (loss_u if loss_u is not None else zero).detach()

    def forward_parts(self, model: nn.Module, parts: list[torch.Tensor]) -> torch.Tensor:
        """Logits of a step's inputs, in order. `train.forward: joint` makes one pass over them
        all; `separate` one pass per part (labeled views, then each view of the unlabeled batch),
        as the authors' code does: under batch-statistics normalisation each part is then
        normalised by its own statistics, not by the mix's. With a model whose outputs do not
        depend on the batch both give the same logits to float rounding."""
        if self.tr.get("forward", "joint") == "joint" or len(parts) == 1:
            return self.forward(model, torch.cat(parts) if len(parts) > 1 else parts[0])
        return torch.cat([self.forward(model, x) for x in parts])

    def begin_terms(self, model: nn.Module, terms: dict[str, Any]) -> None:
        """A strategy's client terms for the round (the instruction's `terms`), before its first
        step: FedProx's `proximal-mu` keeps the received parameters as the anchor."""
        self.proximal_mu = float(terms.get(PROXIMAL_MU, 0.0))
        self.anchor = (
            [p.detach().clone() for p in model.parameters()] if self.proximal_mu > 0 else []
        )

    def client_term(self, model: nn.Module) -> torch.Tensor | None:
        """What a strategy adds to every step's loss (the one hook its client terms reach):
        FedProx's (mu/2) sum |w - w_received|^2 over the trained parameters; None: nothing."""
        if self.proximal_mu <= 0:
            return None
        diffs = torch._foreach_sub(list(model.parameters()), self.anchor)
        return 0.5 * self.proximal_mu * torch.stack(torch._foreach_norm(diffs)).square().sum()

    def unlabeled_batch(
        self, model: nn.Module, data: ClientData, unl_idx: torch.Tensor | None, prior: torch.Tensor
    ):
        """The step's unlabeled inputs, their number of rows and a function of their logits (the
        loss): (None, 0, None) when there are none. The inputs are one tensor, or a tuple of the
        views they hold (e.g. weak and strong): `train.forward=separate` passes each on its own;
        the loss function gets their logits concatenated in order either way."""
        return None, 0, None

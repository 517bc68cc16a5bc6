"""Your own method with soft targets, by path: FixMatch whose targets are the weak view's
prediction sharpened with a temperature (as UDA's), kept where the prediction is confident, and
learnt by soft cross-entropy on strong views; it also keeps a record per unlabeled image across
its rounds.

Run it with the project's clients and server, from any directory:

    flwr run /path/to/feddb-flower --run-config \\
        "method='/abs/path/soft_targets.py:SharpenedTargets' overrides='method.temperature=0.5'"

`select` returns per-image distributions (N x K, rows summing to 1) where a hard-label method
returns labels; FixMatch's `unlabeled_loss` then takes the soft cross-entropy, DPL (`dpl=true`)
divides the probabilities before they are sharpened, and the pseudo-label figures weigh each
target's mass on the true class. `idx` names the images, so `kept` follows each of them.
"""

from __future__ import annotations

from typing import Any

import torch

from fssl.checks import number
from fssl.methods.fixmatch import FixMatch


class SharpenedTargets(FixMatch):
    display = "Sharpened soft targets"  # how `feddb report` names its runs
    # labels from the current model at each step, T = 0.4, the mask at max p >= 0.8 (train.tau)
    defaults = {"pseudo_labels": "online", "temperature": 0.4, "train.tau": 0.8}

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        number({"method": m}, "method.temperature", low=0, open_low=True)

    def load_client_state(self, state):  # what this client kept last round ({} the first time)
        super().load_client_state(state)
        self.kept = state.get("sharpened", {}).get("kept")  # per image: steps it trained in
        self.entropy = torch.zeros(2)  # this round's targets: entropy sum, count

    def client_state(self):  # kept for the client's next round (Flower's context.state)
        out = super().client_state()
        if self.kept is not None:
            out["sharpened"] = {"kept": self.kept.cpu()}
        return out

    def begin_round(self, model, data, probs_u, prior):  # not in warm-up rounds
        if self.kept is None or len(self.kept) != len(probs_u):  # a new client
            self.kept = torch.zeros(len(probs_u), device=self.device)
        self.kept, self.entropy = self.kept.to(self.device), self.entropy.to(self.device)
        return super().begin_round(model, data, probs_u, prior)

    def select(self, probs, idx, learn, raw=None):
        """Soft targets p^(1/T), normalised, and the mask max p >= tau (of DPL's output)."""
        sharpened = probs ** (1.0 / self.cfg["method"]["temperature"])
        targets = sharpened / sharpened.sum(1, keepdim=True)
        mask = probs.max(1).values >= self.tr["tau"]
        if learn:  # these targets train: tensors summed on the device, read once a round
            kept = mask.float()
            self.kept.index_add_(0, idx, kept)
            entropy = -(targets * targets.clamp_min(1e-12).log()).sum(1)
            self.entropy += torch.stack([(entropy * kept).sum(), kept.sum()])
        return targets, mask

    def client_metrics(self) -> dict[str, float]:
        """Its own figures (every round, warm-up ones included): the share of this client's
        images that ever trained, and the mean entropy of this round's kept targets."""
        if self.kept is None:  # no round with unlabeled data yet
            return {}
        total, count = self.entropy.tolist()
        out = {"ever_kept": float((self.kept > 0).float().mean())}
        return out | ({"target_entropy": total / count} if count else {})

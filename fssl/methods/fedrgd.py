"""FedRGD (Zhang et al., IEEE BigData 2021), labels-at-client (its appendix H): CE on local labels
plus FixMatch consistency with pseudo-labels from the current local model (its Eq. 4;
`method.pseudo_labels: online`), and grouping-based model averaging (Eq. 7).

The C sampled clients are split at random into S groups G_i; the server model joins every group:
    w_i = (w_s + sum_{k in G_i} w_k) / (|G_i| + 1),   w_avg = (1/S) sum_i w_i.
In labels_at_server (its native setting) w_s is the server's model: the round's global model
trained on the server's labels while the clients train (`step = "parallel"`). Labels-at-client
has no server data, so the current global model stands in for w_s (the notes' recommendation). One
w_avg is broadcast: clients are resampled every round, so per-group models would not reach the same
clients again. With equal groups this is a damped average that leaves the global model the weight
S / (C + S). With non-uniform weights beta (DMA or sample sizes) the clients of a group share its
|G_i| / (|G_i| + 1) in proportion to beta; uniform beta gives Eq. 7 exactly. The server momentum
step follows, as for every method.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checks import integer
from . import register
from .base import MethodServer
from .fixmatch import FixMatch


class FedRGDServer(MethodServer):
    step = "parallel"
    own_aggregation = "grouped averaging"

    def groups(self, server_round: int, n: int) -> list[np.ndarray]:
        """Random split of positions 0..n-1 into min(S, n) groups of near-equal size, seeded."""
        rng = np.random.default_rng([self.cfg["seed"], server_round, 11])
        s = min(self.cfg["method"]["groups"], n)
        return [np.sort(g) for g in np.array_split(rng.permutation(n), s)]

    def coefficients(
        self, server_round: int, replies: list[dict[str, Any]], weights: np.ndarray
    ) -> np.ndarray:
        groups = self.groups(server_round, len(replies))
        out = np.zeros(len(replies))
        for g in groups:
            share = weights[g] / weights[g].sum()
            out[g] = share * len(g) / (len(g) + 1) / len(groups)
        self.notes["groups"] = [[replies[i]["metrics"]["partition_id"] for i in g] for g in groups]
        return out


@register("fedrgd")
class FedRGD(FixMatch):
    display = "FedRGD"
    server = FedRGDServer

    @classmethod
    def check_params(cls, m: dict[str, Any]) -> None:
        integer({"method": m}, "method.groups", low=1, default=None)

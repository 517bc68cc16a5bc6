"""Which partitions a round trains or evaluates: seeded by (seed, round), independent of node ids,
so every strategy and every launcher draws the same clients; and which rounds are the labels-only
warm-up."""

from __future__ import annotations

from typing import Any

import numpy as np

from fssl.config import clients_per_round


def warmup(cfg: dict[str, Any], server_round: int) -> bool:
    """Whether round t is one of the labels-only warm-up rounds (train.warmup_rounds)."""
    return server_round <= cfg["train"]["warmup_rounds"]


class Sampler:
    """The round's partitions, among those with something to learn this round."""

    def __init__(
        self, cfg: dict[str, Any], known_sizes: dict[int, tuple[int, int]], uses_unlabeled: bool
    ) -> None:
        self.cfg, self.known_sizes, self.uses_unlabeled = cfg, known_sizes, uses_unlabeled

    def labels_only_round(self, server_round: int) -> bool:
        """Whether this round's clients learn from labels alone: a labels-only method, or a
        warm-up round."""
        return not self.uses_unlabeled or warmup(self.cfg, server_round)

    def eligible(self, labels_needed: bool) -> list[int]:
        """The partitions a round may sample: all of them, or those holding labels when the
        round needs them (labels at the server: none; at some clients: those)."""
        m = self.cfg["fl"]["num_clients"]
        if not labels_needed or not self.known_sizes:
            return list(range(m))
        return [pid for pid in range(m) if self.known_sizes.get(pid, (1, 0))[0] > 0]

    def sample(
        self, server_round: int, fraction: float, labels_needed: bool | None = None
    ) -> list[int]:
        """Partition ids for this round (`labels_needed`: default, whether the round is
        labels-only); `fl.always_sample` first, the rest drawn."""
        m = self.cfg["fl"]["num_clients"]
        k = clients_per_round(self.cfg, fraction)
        rng = np.random.default_rng([self.cfg["seed"], server_round, 7])
        if labels_needed is None:
            labels_needed = self.labels_only_round(server_round)
        pool = self.eligible(labels_needed)
        always = sorted(set(self.cfg["fl"].get("always_sample", [])))
        if len(pool) < m:  # some partitions hold nothing this round can learn from
            k = min(k, len(pool))
            fixed = [p for p in always if p in pool][:k]
            rest = np.setdiff1d(pool, fixed)
            drawn = rng.choice(rest, k - len(fixed), replace=False) if k > len(fixed) else []
            return sorted([*fixed, *(int(i) for i in drawn)])
        fixed = always[:k]
        if not fixed:
            return sorted(int(i) for i in rng.choice(m, k, replace=False))
        rest = np.setdiff1d(np.arange(m), fixed)  # the others drawn as usual among the rest
        return sorted([*fixed, *(int(i) for i in rng.choice(rest, k - len(fixed), replace=False))])

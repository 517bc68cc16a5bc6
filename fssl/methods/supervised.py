"""Labels-only training: FedAvg's client, cross-entropy on the client's labeled data (the
unlabeled data only feed APP-U, which every method ships)."""

from __future__ import annotations

from . import register
from .base import LocalTrainer


@register("supervised")
class Supervised(LocalTrainer):
    """FedAvg's client: CE on the labeled data only."""

    display = "FedAvg"

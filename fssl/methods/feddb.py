"""FedDB (Zhu et al., "Estimating before Debiasing", IJCAI 2024): FixMatch's local training
(fssl/methods/fixmatch.py) with debiased pseudo-labelling on the clients (DPL,
fssl/methods/dpl.py) and debiased model aggregation on the server (DMA, fssl/methods/dma.py).
It has no behaviour of its own: every step is FixMatch's, DPL turns the probabilities it labels
from, DMA the weights of the aggregate. conf/method/feddb.yaml switches both on (`dpl: true`,
`dma: true`); `dpl=false` or `dma=false` gives the paper's ablation rows."""

from __future__ import annotations

from . import register
from .fixmatch import FixMatch


@register("feddb")
class FedDB(FixMatch):
    display = "FedDB"
    parts = ("dpl", "dma")  # what FedDB adds to FixMatch: its YAML turns each on

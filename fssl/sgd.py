"""SGD with weight decay, momentum and Nesterov, as torch.optim.SGD computes it on one tensor at a
time (`_single_tensor_sgd`), without torch's Optimizer base class: its constructor imports
torch._dynamo, 1-2 s of every process's first round (each Ray worker's, the server's for DMA)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch


class SGD:
    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0) -> None:
        items = list(params)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
        self.param_groups = [{"lr": lr, "momentum": momentum, "nesterov": nesterov,
                              "weight_decay": weight_decay, **g, "params": list(g["params"])}
                             for g in groups]
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if wd != 0:
                    grad = grad.add(p, alpha=wd)
                if momentum != 0:
                    buf = self.state[p].get("momentum_buffer")
                    if buf is None:
                        buf = grad.detach().clone()
                        self.state[p]["momentum_buffer"] = buf
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1.0)
                    grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
                p.add_(grad, alpha=-lr)

"""SGD with weight decay, momentum and Nesterov, as torch.optim.SGD computes it, without torch's
Optimizer base class: its constructor imports torch._dynamo, 1-2 s of every process's first round
(each Ray worker's, the server's for DMA).

On accelerators the update runs as torch's `_foreach` ops (a handful of kernel launches a step
instead of five per parameter tensor: a WRN-28-2 client round is launch-bound); on the CPU one
tensor at a time (`_single_tensor_sgd`). Both do the same element-wise arithmetic."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch


class SGD:
    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
    ) -> None:
        items = list(params)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
        self.param_groups = [
            {
                "lr": lr,
                "momentum": momentum,
                "nesterov": nesterov,
                "weight_decay": weight_decay,
                **g,
                "params": list(g["params"]),
            }
            for g in groups
        ]
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)
        self.foreach = foreach

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            foreach = self.foreach if self.foreach is not None else params[0].device.type != "cpu"
            (self._foreach_step if foreach else self._single_step)(group, params)

    def _single_step(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        for p in params:
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

    def _foreach_step(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        grads = [p.grad for p in params]
        if wd != 0:
            grads = torch._foreach_add(grads, params, alpha=wd)
        if momentum != 0:
            bufs = [self.state[p].get("momentum_buffer") for p in params]
            old = [i for i, b in enumerate(bufs) if b is not None]
            if old:
                torch._foreach_mul_([bufs[i] for i in old], momentum)
                torch._foreach_add_([bufs[i] for i in old], [grads[i] for i in old], alpha=1.0)
            for i, b in enumerate(bufs):
                if b is None:  # a buffer starts as the parameter's first grad
                    bufs[i] = self.state[params[i]]["momentum_buffer"] = grads[i].detach().clone()
            grads = torch._foreach_add(grads, bufs, alpha=momentum) if group["nesterov"] else bufs
        torch._foreach_add_(params, grads, alpha=-lr)

"""What a method estimates per client across its rounds: named tensors such as DebiasPL's q-hat,
FreeMatch's tau_t, p~ and h~, SoftMatch's p-hat, mu and sigma^2 (exponential moving averages), or
FlexMatch's latest confident class of each image (a record written in place). USB keeps these in
hooks (semilearn/core/hooks: dist_align, masking) and saves each with its algorithm's checkpoint;
here a method names them (`LocalTrainer.keeps`) and the trainer restores them before a client's
round, on the training device, and saves them after it, on the CPU, in one slot of the client
state (Flower's context.state, on the node: never sent or averaged).
"""

from __future__ import annotations

import torch

SLOT = "estimates"  # their name in the client state


class Estimates:
    """A client's running estimates, by the names its method keeps; an estimate is absent until
    the method starts it (`start`) or its first value arrives (`update`)."""

    def __init__(self, names: tuple[str, ...], device: torch.device) -> None:
        self.names, self.device = tuple(names), device
        self.values: dict[str, torch.Tensor] = {}

    def _declared(self, name: str) -> str:
        if name not in self.names:  # it would be lost between rounds
            raise KeyError(f"estimate '{name}' is not among the method's `keeps` {self.names}")
        return name

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.values[name]

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self.values[self._declared(name)] = value

    def get(self, name: str) -> torch.Tensor | None:
        return self.values.get(name)

    def start(self, **initial: torch.Tensor) -> None:
        """A new client's values: when any estimate named in `initial` is absent, or kept with
        another shape (another number of classes or images), all of them take their initial
        values; else the kept ones stay."""
        if any(self.get(n) is None or self.values[n].shape != v.shape for n, v in initial.items()):
            for name, value in initial.items():
                self[name] = value

    def update(self, name: str, value: torch.Tensor, momentum: float) -> torch.Tensor:
        """The exponential moving average momentum * old + (1 - momentum) * value; an absent
        estimate takes `value` itself (USB's DistAlignEMAHook: SoftMatch's p-hat)."""
        old = self.get(name)
        self[name] = value if old is None else momentum * old + (1 - momentum) * value
        return self.values[name]

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        """The values a client kept from its last round ({}: a new client), on the device; a name
        the method no longer keeps is dropped."""
        self.values = {n: v.to(self.device) for n, v in saved.items() if n in self.names}

    def saved(self) -> dict[str, torch.Tensor]:
        """The values to keep for the client's next round, on the CPU."""
        return {name: value.cpu() for name, value in self.values.items()}

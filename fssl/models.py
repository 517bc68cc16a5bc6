"""Models: WRN-28-2 (the paper's) and a small CNN, both with the normalisation switch:
`batchstat` (BatchNorm without running statistics: batch statistics in train and eval, as the
authors' code), `bn` (BatchNorm with running statistics, aggregated like weights) and `gn` (GroupNorm).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable


def norm_layer(kind: str, channels: int, gn_groups: int = 8, bn_momentum: float = 0.1) -> nn.Module:
    if kind == "batchstat":
        return nn.BatchNorm2d(channels, track_running_stats=False)
    if kind == "bn":
        return nn.BatchNorm2d(channels, momentum=bn_momentum)
    if kind == "gn":
        groups = gn_groups if channels % gn_groups == 0 else 1
        return nn.GroupNorm(groups, channels)
    raise ValueError(f"unknown model.norm '{kind}': choose batchstat, bn, gn")


class _OneThreadWeightGrad(torch.autograd.Function):
    """conv2d whose weight and bias gradients are computed on one CPU thread. oneDNN's
    weight gradient splits its sum over the batch among the threads, so its rounding followed
    the thread count: on 2 threads a CNN step's weights differed from one thread's by 1e-7
    (a deployed SuperNode, which has every core, disagreed with the simulated client, which has
    one). The input gradient and the forward pass do not depend on it and keep every thread.
    On one thread already both come from one call, as nn.Conv2d's (the same bits, tested)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(x, weight)
        ctx.conf = (stride, padding, dilation, groups, None if bias is None else bias.shape)
        return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups, bias_shape = ctx.conf
        want_x, want_w, want_b = ctx.needs_input_grad[:3]

        def conv_backward(mask: list[bool]):
            return torch.ops.aten.convolution_backward(
                grad, x, weight, bias_shape, stride, padding, dilation, False, [0, 0], groups, mask
            )

        threads = torch.get_num_threads()
        if threads == 1:  # already one thread (a simulated client): one call, the same bits
            return *conv_backward([want_x, want_w, want_b]), None, None, None, None
        gx = conv_backward([True, False, False])[0] if want_x else None
        gw = gb = None
        if want_w or want_b:
            torch.set_num_threads(1)
            try:
                _, gw, gb = conv_backward([False, want_w, want_b])
            finally:
                torch.set_num_threads(threads)
        return gx, gw, gb, None, None, None, None


class Conv2d(nn.Conv2d):
    """nn.Conv2d (the same parameters and state dict) whose training step on the CPU gives the
    same numbers on any number of threads (_OneThreadWeightGrad); on an accelerator, without
    autograd, or under torch.compile (its own kernels) it is nn.Conv2d's."""

    def _conv_forward(self, x, weight, bias):
        if (
            x.device.type != "cpu"
            or not torch.is_grad_enabled()
            or self.padding_mode != "zeros"
            or torch.compiler.is_compiling()
            or torch.is_autocast_enabled("cpu")  # bf16 on the CPU: autocast's own kernels
        ):
            return super()._conv_forward(x, weight, bias)
        return _OneThreadWeightGrad.apply(
            x, weight, bias, self.stride, self.padding, self.dilation, self.groups
        )


class BasicBlock(nn.Module):
    """Pre-activation residual block (norm -> ReLU -> conv), 1x1 shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int, norm: Any) -> None:
        super().__init__()
        self.n1, self.c1 = norm(cin), Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n2, self.c2 = norm(cout), Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.relu = nn.ReLU()
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = Conv2d(cin, cout, 1, stride, 0, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.relu(self.n1(x))
        y = self.c1(o)
        y = self.c2(self.relu(self.n2(y)))
        return y + (self.shortcut(o) if self.shortcut is not None else x)


class WideResNet(nn.Module):
    def __init__(
        self,
        num_classes: int,
        in_channels: int = 3,
        depth: int = 28,
        widen: int = 2,
        norm: str = "batchstat",
        gn_groups: int = 8,
        bn_momentum: float = 0.1,
    ) -> None:
        super().__init__()
        n = (depth - 4) // 6
        ch = [16, 16 * widen, 32 * widen, 64 * widen]
        make_norm = lambda c: norm_layer(norm, c, gn_groups, bn_momentum)  # noqa: E731
        layers: list[nn.Module] = [Conv2d(in_channels, ch[0], 3, 1, 1, bias=False)]
        for stage, stride in zip(range(3), (1, 2, 2)):
            for i in range(n):
                cin = ch[stage] if i == 0 else ch[stage + 1]
                layers.append(BasicBlock(cin, ch[stage + 1], stride if i == 0 else 1, make_norm))
        layers += [make_norm(ch[3]), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(ch[3], num_classes)
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


class MaxPool2x2(nn.MaxPool2d):
    """2x2 max-pooling, stride 2. Without autograd (evaluation, pseudo-labelling passes) it takes
    the maximum of row pairs, then of column pairs: the same values, and faster than torch's CPU
    max_pool2d kernel for the default layout (6x slower than the rest of the pooling block) or
    the maximum of four strided quarter views (1.2-1.5x; measured, one thread). With autograd it
    is torch's own, so training is unchanged."""

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dim() != 4:
            return super().forward(x)
        h, w = x.shape[2] // 2 * 2, x.shape[3] // 2 * 2  # floor, as max_pool2d
        rows = torch.maximum(x[:, :, 0:h:2], x[:, :, 1:h:2])
        return torch.maximum(rows[..., 0:w:2], rows[..., 1:w:2])


def batch_dependent(model: nn.Module) -> bool:
    """Whether a sample's output in eval mode depends on its batch (batch-statistics BN)."""
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats
        for m in model.modules()
    )


class SmallCNN(nn.Module):
    """Three conv-norm-ReLU blocks (two max-pools), global average pool, linear head."""

    def __init__(
        self,
        num_classes: int,
        in_channels: int = 1,
        width: int = 16,
        norm: str = "batchstat",
        gn_groups: int = 8,
        bn_momentum: float = 0.1,
        hidden: int = 0,
        image_size: int = 28,
    ) -> None:
        super().__init__()
        w = [width, 2 * width, 4 * width]
        layers: list[nn.Module] = []
        cin = in_channels
        for i, cout in enumerate(w):
            layers += [
                Conv2d(cin, cout, 3, 1, 1, bias=False),
                norm_layer(norm, cout, gn_groups, bn_momentum),
                nn.ReLU(),
            ]
            if i < 2:
                layers.append(MaxPool2x2())
            cin = cout
        if hidden:  # keep where features are: flatten the last map, one hidden layer
            side = image_size // 4
            layers += [nn.Flatten(), nn.Linear(w[-1] * side * side, hidden), nn.ReLU()]
        else:  # global average pool
            layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(hidden or w[-1], num_classes)
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def _init(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)


def build_model(
    mcfg: dict[str, Any], num_classes: int, in_channels: int, image_size: int = 28
) -> nn.Module:
    common = dict(
        norm=mcfg["norm"],
        gn_groups=mcfg.get("gn_groups", 8),
        bn_momentum=mcfg.get("bn_momentum", 0.1),
    )
    if mcfg["name"] == "cnn":
        return SmallCNN(
            num_classes,
            in_channels,
            width=mcfg.get("width", 16),
            hidden=mcfg.get("hidden", 0),
            image_size=image_size,
            **common,
        )
    if mcfg["name"] == "wrn28_2":
        return WideResNet(num_classes, in_channels, depth=28, widen=mcfg.get("width", 2), **common)
    raise ValueError(f"unknown model '{mcfg['name']}': choose cnn, wrn28_2")

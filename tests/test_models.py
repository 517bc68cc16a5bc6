import pytest
import torch
from torch import nn

from fssl.models import build_model


def test_wrn28_2_shape_and_size():
    model = build_model({"name": "wrn28_2", "norm": "batchstat"}, 10, 3)
    n = sum(p.numel() for p in model.parameters())
    assert 1.46e6 < n < 1.48e6                      # WRN-28-2: 1.47M parameters
    assert model(torch.randn(4, 3, 32, 32)).shape == (4, 10)


@pytest.mark.parametrize("name,channels,size", [("cnn", 1, 28), ("wrn28_2", 3, 32)])
def test_norm_switch(name, channels, size):
    x = torch.randn(8, channels, size, size)
    bs = build_model({"name": name, "norm": "batchstat"}, 10, channels)
    assert not any("running" in k for k in bs.state_dict())
    bs.eval()
    # batch statistics even in eval mode: a sample's output depends on its batch
    assert not torch.allclose(bs(x)[:1], bs(x[:2])[:1], atol=1e-5)
    bn = build_model({"name": name, "norm": "bn"}, 10, channels)
    assert any(k.endswith("running_mean") for k in bn.state_dict())
    bn.eval()
    assert torch.allclose(bn(x)[:1], bn(x[:2])[:1], atol=1e-5)
    gn = build_model({"name": name, "norm": "gn", "gn_groups": 8}, 10, channels)
    assert any(isinstance(m, nn.GroupNorm) for m in gn.modules())
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gn.modules())


def test_unknown_model():
    with pytest.raises(ValueError, match="cnn, wrn28_2"):
        build_model({"name": "vit", "norm": "bn"}, 10, 3)

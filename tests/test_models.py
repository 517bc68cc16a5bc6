import pytest
import torch
from torch import nn

from fssl.models import build_model


def test_wrn28_2_shape_and_size():
    model = build_model({"name": "wrn28_2", "norm": "batchstat"}, 10, 3)
    n = sum(p.numel() for p in model.parameters())
    assert 1.46e6 < n < 1.48e6  # WRN-28-2: 1.47M parameters
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


@pytest.mark.parametrize("size", [28, 7, 9])
def test_the_inference_max_pool_gives_torchs_values_and_training_keeps_torchs_path(size):
    from fssl.models import MaxPool2x2

    pool = MaxPool2x2()
    x = torch.randn(3, 4, size, size + 1)
    x[0, 0, :2, :2] = 0.5  # ties
    with torch.no_grad():
        assert torch.equal(pool(x), nn.functional.max_pool2d(x, 2))
    xg = x.clone().requires_grad_()
    pool(xg).sum().backward()  # torch's kernel: a tie's gradient goes to one
    ref = x.clone().requires_grad_()
    nn.functional.max_pool2d(ref, 2).sum().backward()
    assert torch.equal(xg.grad, ref.grad) and xg.grad[0, 0, :2, :2].sum() == 1


def test_cpu_evaluation_in_small_batches_gives_the_same_predictions():
    """fssl.train.evaluate runs batch-independent models on a CPU in batches of at most
    CPU_EVAL_BATCH (the same outputs as one pass); batch-statistics models keep the configured
    batches, which decide their outputs."""
    from fssl import augment
    from fssl.models import batch_dependent
    from fssl.train import CPU_EVAL_BATCH, evaluate

    torch.manual_seed(0)
    x, y = torch.rand(3 * CPU_EVAL_BATCH, 1, 28, 28), torch.randint(0, 10, (3 * CPU_EVAL_BATCH,))
    for norm in ("gn", "batchstat"):
        model = build_model({"name": "cnn", "norm": norm}, 10, 1).eval()
        with torch.no_grad():
            logits = model(augment.normalize(x, (0.1,), (0.3,)))
        one_pass = nn.functional.cross_entropy(logits, y).item()
        loss, _, pred, _ = evaluate(model, x, y, (0.1,), (0.3,), len(x))
        assert batch_dependent(model) == (norm == "batchstat")
        assert (
            loss == pytest.approx(one_pass, rel=1e-5) and (pred == logits.argmax(1).numpy()).all()
        )
        conf = evaluate(model, x, y, (0.1,), (0.3,), CPU_EVAL_BATCH)[3]
        one_conf = logits.softmax(1).max(1).values.double().numpy()
        assert (abs(conf - one_conf).max() < 1e-5) == (norm == "gn")


def _step_on(threads: int, mcfg: dict, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """One SGD step of a fresh model on `threads` CPU threads: its gradients and new weights."""
    from fssl.sgd import SGD

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = build_model(mcfg, 10, x.shape[1], x.shape[-1])
        opt = SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        params = list(model.parameters())
        return [p.grad for p in params] + [p.detach() for p in params]
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "mcfg,shape",
    [
        ({"name": "cnn", "norm": "batchstat", "hidden": 128}, (128, 1, 28, 28)),
        ({"name": "cnn", "norm": "gn", "hidden": 0}, (128, 1, 28, 28)),
        ({"name": "wrn28_2", "norm": "bn"}, (8, 3, 32, 32)),
    ],
)
def test_a_training_step_gives_the_same_numbers_on_one_thread_and_on_two(mcfg, shape):
    """A simulated client trains on one thread, a deployed SuperNode on every core: the same
    bits either way. Before, oneDNN's convolution weight gradient and MKL's matrix products
    summed in an order set by the thread count (1e-7 apart after one step)."""
    torch.manual_seed(1)
    x, y = torch.randn(shape), torch.randint(0, 10, (shape[0],))
    one, two = _step_on(1, mcfg, x, y), _step_on(2, mcfg, x, y)
    assert all(torch.equal(a, b) for a, b in zip(one, two))

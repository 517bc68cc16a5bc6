"""The accelerator paths (bf16 autocast, channels_last, torch.compile), exercised on the CPU for
correctness: same training as the fp32 eager path, up to bf16 rounding."""

import os

import pytest
import torch
from conftest import TINY

from fssl.instruction import Instruction
from fssl.methods import make_model, make_trainer
from fssl.runtime import client_data_for, data_meta, dataset_for
from server_app.config import compose


def fit(*overrides, method="feddb"):
    cfg = compose(TINY + [f"method={method}", "train.tau=0.3", *overrides])
    cfg["data_meta"] = meta = data_meta(dataset_for(cfg))
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = make_model(cfg, 10, 1)
    trainer = make_trainer(cfg, meta["mean"], meta["std"], cpu)
    metrics = trainer.fit(model, client_data_for(cfg, 1, cpu), Instruction(0.1, seed=7))
    return trainer, model, metrics


def test_cpu_defaults_to_fp32_and_contiguous():
    trainer, model, _ = fit()
    assert not trainer.bf16 and not trainer.channels_last
    assert next(model.parameters()).is_contiguous()


@pytest.mark.parametrize("method", ["feddb", "fedmatch"])
def test_bf16_and_channels_last_train_like_fp32(method):
    _, ref_model, ref = fit(method=method)
    trainer, model, got = fit("train.precision=bf16", "train.channels_last=true", method=method)
    assert trainer.bf16 and trainer.channels_last
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert got["loss_sup"] == pytest.approx(ref["loss_sup"], rel=0.02)
    assert got["app_u_global"] == pytest.approx(ref["app_u_global"], abs=0.01)
    # the shipped estimate includes the trained local models, where bf16's rounding has built up
    # over the local steps (as in the weights, below); FedMatch's sigma steps are lambda_s = 10
    # times larger, and its estimate moved 0.106 on a 2-core AMD EPYC (2026-11-26), 0.04 elsewhere
    tolerance = {"feddb": 0.04, "fedmatch": 0.15}[method]
    assert got["app_u"] == pytest.approx(ref["app_u"], abs=tolerance)
    a, b = ref_model.state_dict(), model.state_dict()
    assert all(torch.allclose(a[k].float(), b[k].float(), atol=0.05) for k in a)


@pytest.mark.slow
def test_compiled_model_trains_like_eager():
    _, ref_model, ref = fit()
    _, model, got = fit("train.compile=true")
    assert got["loss_sup"] == pytest.approx(ref["loss_sup"], rel=1e-4)
    assert got["app_u"] == pytest.approx(ref["app_u"], abs=1e-4)
    a, b = ref_model.state_dict(), model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)


def test_gpu_share_fits_measured_clients_in_gpu_memory():
    from feddb.resources import CONTEXT_BYTES, gpu_share

    gib = 2**30
    assert gpu_share(80 * gib, 2 * gib, 10) == (0.1, 10)  # capped by clients per round
    share, k = gpu_share(80 * gib, 20 * gib, 10)
    assert k == int(0.9 * 80 * gib // (20 * gib + CONTEXT_BYTES)) == 3 and share == 1 / 3
    assert gpu_share(16 * gib, 40 * gib, 10) == (1.0, 1)  # never below one at a time


def test_gpus_per_client_argument(tiny_cfg, monkeypatch):
    from feddb.launch import gpus_per_client

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpus_per_client("auto", tiny_cfg) == 0.0  # no CUDA: no GPU resource
    with pytest.raises(ValueError, match="trains on the CPU"):  # Ray would wait for a GPU
        gpus_per_client("0.25", tiny_cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpus_per_client("0.25", tiny_cfg) == 0.25
    for bad in ("2", "-1", "half"):
        with pytest.raises(ValueError, match="in \\[0, 1\\] or auto"):
            gpus_per_client(bad, tiny_cfg)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize(
    "momentum,nesterov,wd", [(0.0, False, 0.0), (0.9, True, 5e-4), (0.9, False, 1e-3)]
)
def test_own_sgd_equals_torch_sgd_bit_for_bit(momentum, nesterov, wd, foreach):
    """fssl.sgd.SGD (no torch.optim import cost) takes the same steps as torch.optim.SGD,
    parameter groups, momentum buffers and parameters without gradients included, in both its
    one-tensor-at-a-time and its `_foreach` (accelerator) form."""
    from fssl.sgd import SGD

    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 3)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    groups = [
        [
            {"params": list(n[0].parameters())},
            {"params": list(n[1].parameters()), "weight_decay": 0.0},
        ]
        for n in nets
    ]
    ours = SGD(
        groups[0], lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd, foreach=foreach
    )
    ref = torch.optim.SGD(groups[1], lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    for step in range(5):
        x = torch.randn(8, 5)
        for net, opt in zip(nets, (ours, ref)):
            opt.zero_grad(set_to_none=True)
            head_only = step in (0, 2)  # layer 0: no gradient in steps 0 and 2
            out = net[1](net[0](x).detach() if head_only else net[0](x))
            out.square().mean().backward()
            opt.step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a, b)
    for p, q in zip(nets[0].parameters(), nets[1].parameters()):
        if momentum:
            assert torch.equal(ours.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"])


def test_mps_daemon_started_and_stopped_only_when_not_running(tmp_path, monkeypatch):
    """`feddb run --mps`: starts NVIDIA MPS's control daemon, quits it afterwards; leaves a
    daemon that already answers alone; says what to do when the control program is missing."""
    from feddb.resources import mps

    log, state = tmp_path / "calls", tmp_path / "running"
    fake = tmp_path / "nvidia-cuda-mps-control"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = "-d" ]; then echo start >> {log}; touch {state}; exit 0; fi
read cmd; echo "$cmd" >> {log}
if [ "$cmd" = quit ]; then rm -f {state}; exit 0; fi
[ -f {state} ]
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with mps(True) as line:
        assert "started" in line and state.exists()
    assert not state.exists()
    assert log.read_text().split() == ["get_server_list", "start", "quit"]
    state.touch()  # a daemon someone else runs
    with mps(True) as line:
        assert "already running" in line
    assert state.exists() and log.read_text().split()[-1] == "get_server_list"
    with mps(False) as line:
        assert line == ""
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control is not on PATH"), mps(True):
        pass


@pytest.mark.parametrize("channels", [1, 3])
def test_images_reach_the_model_with_nchw_strides(channels):
    """With one channel numpy's transpose and the augmentations' gathers give channels-last
    strides that still count as contiguous; the convolutions would then take the slower
    channels-last path on a CPU."""
    import numpy as np

    from fssl import augment
    from fssl.train import to_nchw

    nhwc = np.random.default_rng(0).integers(0, 255, (4, 28, 28, channels), dtype=np.uint8)
    x = to_nchw(nhwc, torch.device("cpu"))
    nchw = (channels * 28 * 28, 28 * 28, 28, 1)
    assert x.stride() == nchw and torch.equal(x.permute(0, 2, 3, 1), torch.from_numpy(nhwc))
    gen = torch.Generator().manual_seed(0)
    assert augment.weak(x, True, gen).stride() == nchw
    assert augment.strong(x, True, gen).stride() == nchw


def test_no_grad_passes_run_in_cache_sized_chunks_with_the_same_outputs():
    """On a CPU the pseudo-labelling pass of a batch-independent model runs in chunks of
    CPU_EVAL_BATCH whatever train.infer_batch_size says: the same probabilities to float rounding
    (bit for bit on one thread on a 2-core AMD EPYC; on an AVX-512 Intel Xeon oneDNN's kernels
    depend on the batch size: 3e-8 apart, 2026-11-27). A batch-statistics model keeps the
    configured chunks, which decide its outputs."""
    from fssl.train import CPU_EVAL_BATCH, no_grad_batch

    cfg = compose(TINY + ["train.infer_batch_size=1024"])
    meta = data_meta(dataset_for(cfg))
    trainer = make_trainer(cfg, meta["mean"], meta["std"], torch.device("cpu"))
    x = torch.randint(0, 255, (3 * CPU_EVAL_BATCH + 7, 1, 28, 28), dtype=torch.uint8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for norm in ("gn", "batchstat"):
            torch.manual_seed(0)
            model = make_model(compose(TINY + [f"model.norm={norm}"]), 10, 1).eval()
            chunk = no_grad_batch(model, x, 1024)
            assert chunk == (CPU_EVAL_BATCH if norm == "gn" else 1024)
            with torch.no_grad():
                one_pass = torch.softmax(model(trainer.norm(x)), 1)
            chunked = trainer.predict(model, x)
            assert torch.allclose(chunked, one_pass, rtol=0, atol=1e-6)
            assert torch.equal(chunked.argmax(1), one_pass.argmax(1))
    finally:
        torch.set_num_threads(threads)


def test_freed_memory_is_kept_for_reuse_on_glibc(monkeypatch):
    import ctypes.util
    import sys

    from fssl.runtime import keep_freed_memory

    glibc = sys.platform.startswith("linux") and "libc.so" in (ctypes.util.find_library("c") or "")
    assert keep_freed_memory() == glibc
    monkeypatch.setattr(sys, "platform", "darwin")
    assert keep_freed_memory() is False

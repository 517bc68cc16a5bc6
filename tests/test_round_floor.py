"""`feddb floor --paper-round`: a round's FLOPs counted exactly, composed as the round runs."""

import json

from torch import nn

from benchmarks.roundfloor import (
    client_flops,
    forward_flops,
    measured_rounds,
    paper_round,
    step_flops,
)
from server_app.config import compose

N, CIN, H, W, COUT, K = 6, 3, 8, 8, 4, 3


def tiny() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(CIN, COUT, K, padding=1, bias=False),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(COUT * H * W, 10, bias=False),
    )


def exact(n: int) -> tuple[int, int]:
    """A convolution's and a linear layer's multiply-adds over n images, as 2 FLOPs each."""
    return 2 * n * COUT * H * W * CIN * K * K, 2 * n * COUT * H * W * 10


def test_a_training_steps_count_is_the_exact_one():
    conv, lin = exact(N)
    assert forward_flops(tiny(), (CIN, H, W), N) == conv + lin
    # backward: the linear layer's input and weight gradients, the convolution's weight gradient
    # (its input, the images, needs none)
    assert step_flops(tiny(), (CIN, H, W), N) == (conv + lin) + (2 * lin + conv)


def test_a_clients_round_is_its_passes_and_its_steps():
    m, shape = tiny(), (CIN, H, W)
    got = client_flops(m, shape, n_labeled=2, n_pool=5, n_confident=4, epochs=5, passes=5)
    assert got == 5 * forward_flops(m, shape, 5) + 5 * step_flops(m, shape, 2 + 4)
    assert client_flops(m, shape, 2, 5, 0, 5, 5) == 5 * forward_flops(m, shape, 5) + 5 * step_flops(
        m, shape, 2
    )


def test_a_paper_round_counts_every_sampled_client_and_the_evaluation():
    cfg = compose(["experiment=paper/cifar10_dir0.3"])
    r = paper_round(cfg, 40, 500, 10000)
    assert r["clients"] == 10 and r["step_batch"] == 540
    assert r["round"] == 10 * r["client"] + r["evaluation"]
    # WRN-28-2 on 32 x 32: about 0.36 GFLOP a forward pass per image (the probe: 45.4
    # TFLOP for such a round with one pass; this round also makes Algorithm 2's four APP-U passes)
    per_image = r["evaluation"] / 10000
    assert 0.3e9 < per_image < 0.45e9
    assert 40e12 < r["round"] < 70e12


def test_a_runs_rounds_count_each_clients_confident_images_from_its_record(tmp_path):
    """metrics.jsonl keeps a client's confident fraction, not its count (a run of the bench's
    round, every image confident, once counted as if none were)."""
    cfg = compose(["experiment=paper/cifar10_dir0.3"])
    clients = [
        {"num_labeled": 40, "num_unlabeled": 500, "pseudo_label_ratio": 1.0},
        {"num_labeled": 43, "num_unlabeled": 262, "pseudo_label_ratio": 0.5},
        {"num_labeled": 40, "num_unlabeled": 500, "pseudo_label_ratio": None},  # labels only
    ]
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 1, "clients": clients}) + "\n")
    got = measured_rounds(tmp_path, cfg, test_images=100)["mean_round"]
    from benchmarks.roundfloor import model_for

    m, shape = model_for(cfg, "cpu")
    passes = cfg["train"]["local_epochs"] + (cfg["app_u"].get("estimate") != "literal")
    e = cfg["train"]["local_epochs"]
    want = forward_flops(m, shape, 100) + sum(
        client_flops(m, shape, n_l, n_u, k, e, passes)
        for n_l, n_u, k in ((40, 500, 500), (43, 262, 131), (40, 500, 0))
    )
    assert got == want

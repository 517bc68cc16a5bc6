"""RSCFed and CBAFed, the methods published for labels at some clients (fssl/methods/rscfed.py,
cbafed.py), against their official code's numbers; their 2-round runs: tests/test_scenarios.py."""

import math

import numpy as np
import pytest
import torch
from test_scenarios import client, strategy_for, trainer_and_model

from fssl.checks import ConfigError
from fssl.instruction import Instruction
from fssl.methods.cbafed import thresholds
from fssl.methods.rscfed import subset_weights
from server_app.config import resolve

RSCFED = {"w_mul_times": 6, "sup_scale": 100, "dist_scale": 1e4}
PARTIAL = "scenario=labels_at_partial_clients"


def official_rscfed(arrays, sizes, labeled, m):
    """train_main.py:289-323 of xmed-lab/RSCFed (the "avg" branch), transcribed."""
    q = [n / sum(sizes) for n in sizes]
    mean = {k: sum(w * a[k] for w, a in zip(q, arrays)) for k in arrays[0]}
    dist = [sum(np.linalg.norm(a[k] - mean[k]) for k in a) for a in arrays]
    scale = m["sup_scale"] if any(labeled) else m["dist_scale"]
    r = [q[i] * math.exp(-scale * dist[i] / sizes[i]) for i in range(len(q))]
    r = [w * m["w_mul_times"] if lab else w for w, lab in zip(r, labeled)]
    return np.array(r) / sum(r)


@pytest.mark.parametrize("labeled", [(True, False, False), (False, False, False)])
def test_rscfeds_distance_reweighting_is_the_official_codes(labeled):
    rng = np.random.default_rng(0)
    arrays = [{"w": rng.normal(size=(4, 3)), "b": rng.normal(size=3)} for _ in range(3)]
    sizes = np.array([700.0, 650.0, 720.0])
    got, _ = subset_weights(arrays, sizes / 5, sizes, np.array(labeled), RSCFED)
    assert np.allclose(got, official_rscfed(arrays, list(sizes), labeled, RSCFED))
    # far apart: every exp underflows in the official code (0/0); log space stays finite
    far = [{k: v * 1e4 for k, v in a.items()} for a in arrays]
    got, _ = subset_weights(far, sizes, sizes, np.array(labeled), RSCFED)
    assert np.isfinite(got).all() and np.isclose(got.sum(), 1)


def test_rscfed_trains_the_union_of_its_subsets_and_averages_their_consensus():
    sizes = [(50, 50), (50, 50)] + [(0, 400)] * 6
    s = strategy_for(f"fl.num_clients=8 train.warmup_rounds=1 {PARTIAL}", "rscfed", sizes)
    assert s.method.clients(1, list(range(8)), [0, 1]) == [0, 1]  # the warm-up's own draw
    union = s.method.clients(2, list(range(8)), [])
    subsets = s.method.subsets[2]
    assert len(subsets) == 3 and all(len(x) == 5 for x in subsets)
    assert union == sorted({p for x in subsets for p in x})
    replies = [
        {
            "arrays": {"w": np.full(3, float(p), dtype=np.float32)},
            "metrics": {"partition_id": p},
            "sizes": sizes[p],
        }
        for p in union
    ]
    s.begin_round(2, union)
    c = s.coefficients(2, replies)
    assert np.isclose(c.sum(), 1) and len(s.round_record.method["subsets"]) == 3


def test_rscfeds_teacher_follows_the_student_and_persists_between_rounds():
    trainer, model = trainer_and_model(
        f"{PARTIAL} train.mode=minibatch train.local_steps=3 train.batch_size=8 train.mu=1",
        "rscfed",
    )
    m = trainer.fit(model, client(0, 32), Instruction(0.1, seed=1))
    assert m["method"] == {"teacher_steps": 3.0, "teacher_alpha": pytest.approx(2 / 3)}
    assert trainer.make_optimizer(model, 1.0).param_groups[0]["lr"] == pytest.approx(0.7)
    kept = trainer.client_state()
    again, model2 = trainer_and_model(
        f"{PARTIAL} train.mode=minibatch train.local_steps=1 train.batch_size=8 train.mu=1",
        "rscfed",
    )
    m = again.fit(model2, client(0, 32), Instruction(0.1, seed=2), kept)
    assert m["method"] == {"teacher_steps": 4.0, "teacher_alpha": pytest.approx(3 / 4)}
    assert m["loss_unsup"] > 0


def test_cbafeds_thresholds_are_the_official_codes_on_their_svhn_client():
    counts = np.array([15, 292, 986, 116, 63, 1285, 1352, 1438, 807, 267], dtype=float)
    m = {"tau_base": 0.84, "tau_cap": 0.9, "second_below": 0.03}
    tau, second = thresholds(counts, m)
    want = [0.755636, 0.797473, 0.9, 0.770891, 0.762886, 0.9, 0.9, 0.9, 0.875256, 0.793697]
    assert np.allclose(tau, want, atol=1e-5)
    assert np.flatnonzero(second).tolist() == [0, 3, 4]


def test_cbafed_keeps_rare_classes_second_labels():
    trainer, _ = trainer_and_model(PARTIAL, "cbafed")
    trainer.received = {
        "cbafed": {"thresholds": np.full(3, 0.8), "second": np.array([0.0, 0.0, 1.0])}
    }
    probs = torch.tensor([[0.9, 0.05, 0.05], [0.6, 0.1, 0.3], [0.6, 0.3, 0.1]])
    labels, mask = trainer.select(probs, None, True)
    assert labels.tolist()[:2] == [0, 2] and mask.tolist() == [True, True, False]


def test_cbafeds_server_mixes_the_recorded_model_back_every_fifth_round():
    s = strategy_for(f"train.warmup_rounds=1 {PARTIAL}", "cbafed").method
    model = {"w": np.zeros(2, dtype=np.float32)}
    for t in range(2, 8):  # semi-supervised rounds 0..5
        new = s.after_update(t, model, {"w": model["w"] + 1})
        model = new
    assert np.allclose(model["w"], 3.0)  # 6 at the 5th round after the first, halfway to 0
    s2 = strategy_for(f"train.warmup_rounds=1 {PARTIAL}", "cbafed").method
    s2.load_state(s.state())
    assert np.allclose(s2.record["w"], s.record["w"])


@pytest.mark.parametrize(
    "method,overrides,match",
    [  # a scenario, dpl: tests/test_bad_inputs.py
        ("rscfed", "dma.enabled=true", "dma=true with method rscfed: RSCFed's weights are its own"),
        ("cbafed", "method.pseudo_labels=online", "method.pseudo_labels=online with method cbafed"),
        *(  # ten labeled clients: as many as a round samples, so that DP's own check passes
            (m, f"dp.mode={mode} scenario.labeled_clients=10", f"dp.mode={mode} with method {m}:")
            for m in ("rscfed", "cbafed")
            for mode in ("fixed", "adaptive")
        ),
    ],
)
def test_what_the_partial_clients_methods_refuse(method, overrides, match):
    with pytest.raises(ConfigError, match=match):
        resolve({"method": method, "scenario": "labels_at_partial_clients", "overrides": overrides})


def test_cbafeds_labeled_client_mixes_back_its_recorded_weights_every_fifth_epoch():
    """With sup_residual_keep=1 the mixes at epochs 5 and 10 return the weights after epoch 0, so
    11 epochs upload what 1 epoch does (same seed)."""
    base = f"{PARTIAL} train.mode=minibatch train.local_steps=2 train.batch_size=8"
    uploads = []
    for epochs in (11, 1):
        trainer, model = trainer_and_model(
            f"{base} method.sup_epochs={epochs} method.sup_residual_keep=1.0", "cbafed"
        )
        trainer.fit(model, client(16, 16), Instruction(0.1, seed=1, lambda_u=1.0))
        uploads.append(model.state_dict())
    for key, value in uploads[0].items():
        assert torch.allclose(value, uploads[1][key]), key

import numpy as np
import pytest

from fssl.methods.dma import dma_loss, dma_weights, project_simplex


def skewed_app_u(m=10, k=10, delta=0.3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(k, delta), size=m) * 0.9 + 0.1 / k


@pytest.mark.parametrize("seed", range(5))
def test_softmax_mode_beats_uniform_on_skewed_app_u(seed):
    p = skewed_app_u(seed=seed)
    res = dma_weights(p, "softmax", steps=100, lr=1.0)
    assert res.loss < 0.9 * res.loss_uniform
    assert res.loss == pytest.approx(dma_loss(res.weights, p))
    assert res.weights.min() >= 0 and res.weights.sum() == pytest.approx(1)
    assert res.entropy < np.log(10)


def test_identical_app_u_gives_uniform_weights():
    p = np.tile(np.array([0.5, 0.3, 0.2]), (6, 1))
    for mode in ("softmax", "literal", "exact"):
        res = dma_weights(p, mode)
        assert np.allclose(res.weights, 1 / 6)
        assert res.loss == pytest.approx(res.loss_uniform)


def algorithm1(p, steps, lr):
    """Algorithm 1 as printed, with the analytic gradient of L = ||beta^T P - 1/K||."""
    m, k = p.shape
    beta = np.full(m, 1.0 / m)
    for _ in range(steps):
        diff = beta @ p - 1.0 / k
        grad = p @ diff / np.linalg.norm(diff)
        z = beta - lr * grad
        beta = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    return beta


def test_literal_mode_matches_algorithm_1_and_stays_near_uniform():
    p = skewed_app_u(seed=3)
    res = dma_weights(p, "literal", steps=100, lr=1.0)
    assert np.allclose(res.weights, algorithm1(p, 100, 1.0), atol=1e-12)
    assert res.weights.max() / res.weights.min() < 1.5  # softmax of probabilities
    soft = dma_weights(p, "softmax")
    assert soft.loss < res.loss


def test_exact_mode_is_the_simplex_optimum():
    p = np.array([[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]])
    res = dma_weights(p, "exact")
    assert res.loss == pytest.approx(0.0, abs=1e-6)  # e.g. mix of clients 0 and 2
    q = skewed_app_u(seed=1)
    exact, soft = dma_weights(q, "exact"), dma_weights(q, "softmax")
    assert exact.loss <= soft.loss + 1e-9
    rng = np.random.default_rng(0)
    for _ in range(200):  # no random feasible point is better
        w = rng.dirichlet(np.ones(10))
        assert dma_loss(w, q) >= exact.loss - 1e-9


def test_project_simplex():
    w = project_simplex(np.array([0.6, 0.6, -1.0]))
    assert np.allclose(w, [0.5, 0.5, 0.0])


def test_unknown_mode():
    with pytest.raises(ValueError, match="softmax, literal, exact"):
        dma_weights(np.eye(2), "bogus")


def uniform_reporter_among_honest(seed=0, honest=4, k=10):
    """Four clients with Dirichlet(0.3)-skewed APP-U and a fifth reporting the uniform vector."""
    rng = np.random.default_rng(seed)
    return np.vstack([rng.dirichlet(np.full(k, 0.3), size=honest), np.full(k, 1.0 / k)])


@pytest.mark.parametrize("seed", range(3))
def test_unbounded_dma_hands_the_aggregate_to_a_uniform_reporter(seed):
    p = uniform_reporter_among_honest(seed)
    assert dma_weights(p, "softmax", cap=None).weights[-1] > 0.8
    assert dma_weights(p, "exact", cap=None).weights[-1] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("mode", ["softmax", "literal", "exact"])
@pytest.mark.parametrize("seed", range(3))
def test_the_cap_bounds_every_weight_in_every_mode(mode, seed):
    p = uniform_reporter_among_honest(seed)
    res = dma_weights(p, mode, cap=2.0)
    assert res.weights.max() <= 2.0 / 5 + 1e-9
    assert res.weights.min() >= 0 and res.weights.sum() == pytest.approx(1)
    if mode != "literal":  # literal stays near uniform: the cap never binds
        assert res.at_cap == 1 and res.weights[-1] == pytest.approx(0.4)


def test_capped_exact_is_the_optimum_over_the_capped_simplex():
    p = uniform_reporter_among_honest(1)
    res = dma_weights(p, "exact", cap=2.0)
    rng = np.random.default_rng(0)
    for _ in range(300):  # no random feasible point does better
        w = rng.dirichlet(np.ones(5))
        if w.max() <= 0.4:
            assert res.loss <= dma_loss(w, p) + 1e-9


def test_capped_projection_is_the_nearest_feasible_point():
    from fssl.methods.dma import project_capped_simplex

    rng = np.random.default_rng(2)
    for _ in range(50):
        v = rng.normal(size=6) * 2
        w = project_capped_simplex(v, 0.3)
        assert w.sum() == pytest.approx(1) and w.min() >= 0 and w.max() <= 0.3 + 1e-12
        for _ in range(40):
            z = rng.dirichlet(np.ones(6))
            if z.max() <= 0.3:
                assert np.linalg.norm(v - w) <= np.linalg.norm(v - z) + 1e-9


def test_a_cap_that_does_not_bind_changes_nothing():
    p = skewed_app_u(seed=4)
    for mode in ("softmax", "literal", "exact"):
        free = dma_weights(p, mode, cap=None)
        loose = dma_weights(p, mode, cap=free.weights.max() * len(p) * 1.01)
        assert np.allclose(free.weights, loose.weights, atol=1e-9) and loose.at_cap == 0


def test_a_cap_below_one_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="cap >= 1"):
        dma_weights(skewed_app_u(), "softmax", cap=0.5)


@pytest.mark.parametrize("cap", [None, 2.0, 1.2])
def test_the_written_out_gradient_is_torchs_autograd(cap):
    """solve_softmax's SGD steps use softmax_loss_grad: the weights, loss and gradient that
    torch's autograd gives through softmax, cap_scale and the loss, capped or not."""
    import math

    import torch

    from fssl.methods.dma import _loss_t, cap_scale, softmax_loss_grad

    rng = np.random.default_rng(3)
    capped = 0
    for _ in range(30):
        m = int(rng.integers(2, 11))
        p = rng.dirichlet(np.full(10, 0.3), size=m)
        theta = rng.normal(scale=1.5, size=m)
        upper = math.inf if cap is None else cap / m
        t = torch.tensor(theta, requires_grad=True)
        beta = cap_scale(torch.softmax(t, 0), upper)
        loss = _loss_t(beta, torch.as_tensor(p))
        loss.backward()
        got_beta, got_loss, got_grad = softmax_loss_grad(theta, p, upper)
        capped += bool(np.isclose(got_beta.max(), upper))
        assert np.allclose(got_beta, beta.detach().numpy(), rtol=0, atol=1e-14)
        assert got_loss == pytest.approx(loss.item(), rel=1e-13)
        assert np.allclose(got_grad, t.grad.numpy(), rtol=1e-10, atol=1e-15)
    assert cap is None or capped > 5  # the cap's branch was exercised

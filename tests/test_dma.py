import numpy as np
import pytest

from fssl.dma import dma_loss, dma_weights, project_simplex


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
    assert res.weights.max() / res.weights.min() < 1.5        # softmax of probabilities
    soft = dma_weights(p, "softmax")
    assert soft.loss < res.loss


def test_exact_mode_is_the_simplex_optimum():
    p = np.array([[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]])
    res = dma_weights(p, "exact")
    assert res.loss == pytest.approx(0.0, abs=1e-6)           # e.g. mix of clients 0 and 2
    q = skewed_app_u(seed=1)
    exact, soft = dma_weights(q, "exact"), dma_weights(q, "softmax")
    assert exact.loss <= soft.loss + 1e-9
    rng = np.random.default_rng(0)
    for _ in range(200):                                       # no random feasible point is better
        w = rng.dirichlet(np.ones(10))
        assert dma_loss(w, q) >= exact.loss - 1e-9


def test_project_simplex():
    w = project_simplex(np.array([0.6, 0.6, -1.0]))
    assert np.allclose(w, [0.5, 0.5, 0.0])


def test_unknown_mode():
    with pytest.raises(ValueError, match="softmax, literal, exact"):
        dma_weights(np.eye(2), "bogus")

"""Debiased model aggregation (DMA): weights beta on the simplex over this round's clients so that
sum_m beta_m p_bar_m is as close as possible to uniform, L(beta) = ||sum_m beta_m p_bar_m - 1/K||_2.

Modes:
- `softmax` (default, the paper's intent): beta = softmax(theta), theta = 0 at start (uniform),
  `steps` gradient steps of size `lr` on theta (SGD or Adam); the best iterate is returned, so
  L(beta) <= L(uniform) always.
- `literal`: Algorithm 1 as printed: beta <- beta - lr * grad L(beta); beta <- softmax(beta), from
  uniform. Softmax of values in [0, 1] keeps beta near uniform (the ablation that shows it).
- `exact`: the minimiser over the simplex (accelerated projected gradient on L^2).

Bounded DMA (`cap` = kappa): every beta_m <= kappa/m, so no client, however its APP-U looks, takes more
than kappa/m of the aggregate (kappa = inf: the paper's unbounded DMA). `exact` minimises over the
capped simplex; `softmax` and `literal` rescale their iterate, mass above the cap going to the other
clients in proportion (`cap_scale`), so the cap holds inside the optimisation, not only after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..sgd import SGD


@dataclass
class DMAResult:
    weights: np.ndarray
    loss_uniform: float
    loss: float
    entropy: float
    at_cap: int = 0  # clients whose weight the cap holds down


def dma_loss(beta: np.ndarray, app_u: np.ndarray) -> float:
    k = app_u.shape[1]
    return float(np.linalg.norm(np.asarray(beta) @ app_u - 1.0 / k))


def _loss_t(beta: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    diff = beta @ p - 1.0 / p.shape[1]
    return torch.sqrt((diff * diff).sum())


def cap_scale(beta: torch.Tensor, upper: float) -> torch.Tensor:
    """beta' = min(upper, c_i * beta) on the simplex: weights over `upper` are set to it and the
    excess is spread over the others in proportion to their weights (differentiable; needs
    upper * m >= 1). Which weights are held comes from cap_scale_np."""
    _, held = cap_scale_np(beta.detach().cpu().numpy(), upper)
    if held is None:
        return beta
    fixed = torch.as_tensor(held, device=beta.device)
    free_sum = torch.where(fixed, torch.zeros_like(beta), beta).sum()
    scaled = beta * (1.0 - upper * int(held.sum())) / free_sum.clamp_min(1e-300)
    return torch.where(fixed, torch.full_like(beta, upper), scaled)


def cap_scale_np(beta: np.ndarray, upper: float) -> tuple[np.ndarray, np.ndarray | None]:
    """cap_scale in numpy: the capped weights and the mask of those held at `upper` (None: no
    cap applied). Weights over `upper` are held at it and the rest rescaled to fill the
    remainder, until none is over."""
    if not math.isfinite(upper) or beta.max() <= upper:
        return beta, None
    fixed = np.zeros(len(beta), dtype=bool)
    out, used = beta, fixed
    for _ in range(len(beta)):
        used = fixed
        scaled = beta * (1.0 - upper * fixed.sum()) / max(beta[~fixed].sum(), 1e-300)
        out = np.where(fixed, upper, scaled)
        over = ~fixed & (out > upper)
        if not over.any():
            break
        fixed = fixed | over
    return out, used


def softmax_loss_grad(
    theta: np.ndarray, p: np.ndarray, upper: float = math.inf
) -> tuple[np.ndarray, float, np.ndarray]:
    """The capped softmax weights of theta, DMA's loss and its gradient in theta, written out
    (what torch's autograd gives through softmax, cap_scale and _loss_t; tested)."""
    e = np.exp(theta - theta.max())
    soft = e / e.sum()
    beta, fixed = cap_scale_np(soft, upper)
    diff = beta @ p - 1.0 / p.shape[1]
    loss = math.sqrt(float((diff * diff).sum()))
    grad = p @ diff / loss if loss > 0 else np.zeros_like(theta)  # d loss / d beta
    if fixed is not None:  # through the cap: the free weights scaled to fill c
        free = ~fixed
        total = max(float(soft[free].sum()), 1e-300)
        inner = float((grad[free] * soft[free]).sum()) / total
        grad = np.where(free, (1.0 - upper * int(fixed.sum())) / total * (grad - inner), 0.0)
    return beta, loss, soft * (grad - float((grad * soft).sum()))  # softmax's Jacobian


def solve_softmax_sgd(
    app_u: np.ndarray, steps: int = 100, lr: float = 1.0, upper: float = math.inf
) -> np.ndarray:
    """solve_softmax with plain SGD in numpy: the same steps as with torch's autograd, 7x faster
    (100 steps on tiny tensors are all dispatch overhead in torch: 12 ms of every round's
    aggregation, on the round's critical path)."""
    p = np.asarray(app_u, dtype=np.float64)
    theta = np.zeros(p.shape[0])
    best_beta, best_loss = np.full(p.shape[0], 1.0 / p.shape[0]), math.inf
    for step in range(steps + 1):
        beta, loss, grad = softmax_loss_grad(theta, p, upper)
        if loss < best_loss:
            best_loss, best_beta = loss, beta.copy()
        if step == steps or loss == 0.0:
            break
        theta = theta - lr * grad
    return best_beta


def solve_softmax(
    app_u: np.ndarray,
    steps: int = 100,
    lr: float = 1.0,
    optimizer: str = "sgd",
    upper: float = math.inf,
) -> np.ndarray:
    if optimizer == "sgd":
        return solve_softmax_sgd(app_u, steps, lr, upper)
    p = torch.as_tensor(app_u, dtype=torch.float64)
    theta = torch.zeros(p.shape[0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=lr) if optimizer == "adam" else SGD([theta], lr=lr)
    best_beta, best_loss = torch.softmax(theta.detach(), 0), float("inf")
    for step in range(steps + 1):
        beta = cap_scale(torch.softmax(theta, 0), upper)
        loss = _loss_t(beta, p)
        if loss.item() < best_loss:
            best_loss, best_beta = loss.item(), beta.detach().clone()
        if step == steps or loss.item() == 0.0:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    return best_beta.numpy()


def solve_literal(
    app_u: np.ndarray, steps: int = 100, lr: float = 1.0, upper: float = math.inf
) -> np.ndarray:
    p = torch.as_tensor(app_u, dtype=torch.float64)
    beta = torch.full((p.shape[0],), 1.0 / p.shape[0], dtype=torch.float64)
    for _ in range(steps):
        beta.requires_grad_(True)
        loss = _loss_t(beta, p)
        if loss.item() == 0.0:
            break
        (grad,) = torch.autograd.grad(loss, beta)
        beta = cap_scale(torch.softmax(beta.detach() - lr * grad, 0), upper)
    return beta.detach().numpy()


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {w >= 0, sum w = 1} (sort-based)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    rho = np.nonzero(u - css / np.arange(1, len(v) + 1) > 0)[0][-1]
    return np.maximum(v - css[rho] / (rho + 1.0), 0.0)


def project_capped_simplex(v: np.ndarray, upper: float) -> np.ndarray:
    """Euclidean projection onto {0 <= w <= upper, sum w = 1}: w = clip(v - t, 0, upper) with the
    shift t found by bisection (sum is monotone in t); the plain simplex when upper is inf."""
    if not math.isfinite(upper):
        return project_simplex(v)
    lo, hi = float(v.min()) - upper, float(v.max())  # sum >= 1 at lo (m*upper >= 1), 0 at hi
    for _ in range(200):
        t = 0.5 * (lo + hi)
        if np.clip(v - t, 0.0, upper).sum() > 1.0:
            lo = t
        else:
            hi = t
        if hi - lo < 1e-15:
            break
    w = np.clip(v - 0.5 * (lo + hi), 0.0, upper)
    return w / w.sum()


def solve_exact(
    app_u: np.ndarray, iters: int = 20000, tol: float = 1e-13, upper: float = math.inf
) -> np.ndarray:
    p = np.asarray(app_u, dtype=np.float64)
    m, k = p.shape
    target = np.full(k, 1.0 / k)
    lipschitz = 2.0 * max(np.linalg.eigvalsh(p @ p.T).max(), 1e-12)
    beta = np.full(m, 1.0 / m)
    y, t = beta.copy(), 1.0
    for _ in range(iters):
        grad = 2.0 * p @ (y @ p - target)
        nxt = project_capped_simplex(y - grad / lipschitz, upper)
        t_next = (1 + np.sqrt(1 + 4 * t * t)) / 2
        y = nxt + (t - 1) / t_next * (nxt - beta)
        if np.abs(nxt - beta).max() < tol:
            beta = nxt
            break
        beta, t = nxt, t_next
    return beta


def dma_weights(
    app_u: np.ndarray,
    mode: str = "softmax",
    steps: int = 100,
    lr: float = 1.0,
    optimizer: str = "sgd",
    cap: float | None = None,
) -> DMAResult:
    """DMA's weights for the rows of `app_u`; `cap` = kappa bounds each at kappa/m (None or inf:
    unbounded; kappa >= 1, since the weights must still sum to 1)."""
    app_u = np.asarray(app_u, dtype=np.float64)
    m = app_u.shape[0]
    kappa = math.inf if cap is None else float(cap)
    if kappa < 1:
        raise ValueError(
            f"dma.cap={cap} is below 1: m weights of at most cap/m cannot sum to 1; "
            "use a cap >= 1 (e.g. 2) or null for the paper's unbounded DMA"
        )
    upper = kappa / m
    uniform = np.full(m, 1.0 / m)
    if mode == "softmax":
        beta = solve_softmax(app_u, steps, lr, optimizer, upper)
    elif mode == "literal":
        beta = solve_literal(app_u, steps, lr, upper)
    elif mode == "exact":
        beta = solve_exact(app_u, upper=upper)
    else:
        raise ValueError(f"unknown dma.mode '{mode}': choose softmax, literal, exact")
    beta = beta / beta.sum()
    if math.isfinite(upper):
        beta = np.minimum(beta, upper)  # rounding only: the solvers respect it
        beta = beta / beta.sum()
    nz = beta > 0
    ent = float(-np.sum(beta[nz] * np.log(beta[nz])))
    at_cap = int(np.sum(beta >= upper * (1 - 1e-6))) if math.isfinite(upper) else 0
    return DMAResult(beta, dma_loss(uniform, app_u), dma_loss(beta, app_u), ent, at_cap)

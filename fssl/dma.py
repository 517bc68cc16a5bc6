"""Debiased model aggregation (DMA): weights beta on the simplex over this round's clients so that
sum_m beta_m p_bar_m is as close as possible to uniform, L(beta) = ||sum_m beta_m p_bar_m - 1/K||_2.

Modes:
- `softmax` (default, the paper's intent): beta = softmax(theta), theta = 0 at start (uniform),
  `steps` gradient steps of size `lr` on theta (SGD or Adam); the best iterate is returned, so
  L(beta) <= L(uniform) always.
- `literal`: Algorithm 1 as printed: beta <- beta - lr * grad L(beta); beta <- softmax(beta), from
  uniform. Softmax of values in [0, 1] keeps beta near uniform (the ablation that shows it).
- `exact`: the minimiser over the simplex (accelerated projected gradient on L^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DMAResult:
    weights: np.ndarray
    loss_uniform: float
    loss: float
    entropy: float


def dma_loss(beta: np.ndarray, app_u: np.ndarray) -> float:
    k = app_u.shape[1]
    return float(np.linalg.norm(np.asarray(beta) @ app_u - 1.0 / k))


def _loss_t(beta: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    diff = beta @ p - 1.0 / p.shape[1]
    return torch.sqrt((diff * diff).sum())


def solve_softmax(app_u: np.ndarray, steps: int = 100, lr: float = 1.0,
                  optimizer: str = "sgd") -> np.ndarray:
    p = torch.as_tensor(app_u, dtype=torch.float64)
    theta = torch.zeros(p.shape[0], dtype=torch.float64, requires_grad=True)
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)([theta], lr=lr)
    best_beta, best_loss = torch.softmax(theta.detach(), 0), float("inf")
    for step in range(steps + 1):
        beta = torch.softmax(theta, 0)
        loss = _loss_t(beta, p)
        if loss.item() < best_loss:
            best_loss, best_beta = loss.item(), beta.detach().clone()
        if step == steps or loss.item() == 0.0:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    return best_beta.numpy()


def solve_literal(app_u: np.ndarray, steps: int = 100, lr: float = 1.0) -> np.ndarray:
    p = torch.as_tensor(app_u, dtype=torch.float64)
    beta = torch.full((p.shape[0],), 1.0 / p.shape[0], dtype=torch.float64)
    for _ in range(steps):
        beta.requires_grad_(True)
        loss = _loss_t(beta, p)
        if loss.item() == 0.0:
            break
        (grad,) = torch.autograd.grad(loss, beta)
        beta = torch.softmax(beta.detach() - lr * grad, 0)
    return beta.detach().numpy()


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {w >= 0, sum w = 1} (sort-based)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    rho = np.nonzero(u - css / np.arange(1, len(v) + 1) > 0)[0][-1]
    return np.maximum(v - css[rho] / (rho + 1.0), 0.0)


def solve_exact(app_u: np.ndarray, iters: int = 20000, tol: float = 1e-13) -> np.ndarray:
    p = np.asarray(app_u, dtype=np.float64)
    m, k = p.shape
    target = np.full(k, 1.0 / k)
    lipschitz = 2.0 * max(np.linalg.eigvalsh(p @ p.T).max(), 1e-12)
    beta = np.full(m, 1.0 / m)
    y, t = beta.copy(), 1.0
    for _ in range(iters):
        grad = 2.0 * p @ (y @ p - target)
        nxt = project_simplex(y - grad / lipschitz)
        t_next = (1 + np.sqrt(1 + 4 * t * t)) / 2
        y = nxt + (t - 1) / t_next * (nxt - beta)
        if np.abs(nxt - beta).max() < tol:
            beta = nxt
            break
        beta, t = nxt, t_next
    return beta


def dma_weights(app_u: np.ndarray, mode: str = "softmax", steps: int = 100, lr: float = 1.0,
                optimizer: str = "sgd") -> DMAResult:
    app_u = np.asarray(app_u, dtype=np.float64)
    m = app_u.shape[0]
    uniform = np.full(m, 1.0 / m)
    if mode == "softmax":
        beta = solve_softmax(app_u, steps, lr, optimizer)
    elif mode == "literal":
        beta = solve_literal(app_u, steps, lr)
    elif mode == "exact":
        beta = solve_exact(app_u)
    else:
        raise ValueError(f"unknown dma.mode '{mode}': choose softmax, literal, exact")
    beta = beta / beta.sum()
    nz = beta > 0
    ent = float(-np.sum(beta[nz] * np.log(beta[nz])))
    return DMAResult(beta, dma_loss(uniform, app_u), dma_loss(beta, app_u), ent)

"""Measures of lazy training: how far a federated model strays from a linear one, and from its peers.

Jian & Liu, "Widening the Network Mitigates the Impact of Data Heterogeneity on FedAvg", ICML 2025:
* Thm 1: the clients' models stay close to their average, sum_i p_i ||theta_i - theta_bar|| <= zeta
  with zeta = O(n^{-1/2}) for width n                                      -> ``divergence``
* Thm 2: the network stays close to its linearisation around the initial parameters,
  sup_t ||f_lin - f|| = O(n^{-1/2})                                        -> ``linearization_rmse``
* Thm 3 / Fig. 6: at infinite width FedAvg gives the outputs of centralized gradient descent after
  the same number of steps                                                 -> ``rmse`` of two outputs
* Figs. 3-4: the parameters barely move, sqrt(||w_t - w_0||^2 / |w|)      -> ``param_rmse``
The kernel itself is in tasks/ntk.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, jvp

from taciturn.core.params import Params, num_elements, sub, weighted_sum


@torch.no_grad()
def outputs(model: nn.Module, params: Params, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """f(x; params) as an (N, C) tensor."""
    parts = [functional_call(model, params, (x[s : s + batch_size],)) for s in range(0, len(x), batch_size)]
    return torch.cat(parts).reshape(len(x), -1)


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """Root mean squared difference of two equally shaped tensors (e.g. two runs' outputs)."""
    return float((a - b).pow(2).mean().sqrt())


def squared_norm(p: Params) -> float:
    """||p||^2 summed exactly over tensors (math.fsum), so the result does not depend on the order
    of the dict, which differs between a model's and a decoded message's parameters."""
    return math.fsum(float(v.double().pow(2).sum()) for v in p.values())


def param_rmse(a: Params, b: Params) -> float:
    """sqrt(||a - b||^2 / |a|): the RMSE between two parameter vectors."""
    return math.sqrt(squared_norm(sub(a, b)) / num_elements(a))


def divergence(models: Sequence[Params], weights: Sequence[float]) -> float:
    """sum_i p_i ||theta_i - theta_bar||, theta_bar = sum_i p_i theta_i, p_i = weights_i / sum(weights).

    Only differences enter, so the models may all be given relative to one common point (FedAvg's
    deltas from the broadcast model) without changing the value.
    """
    if len(models) != len(weights) or not models:
        raise ValueError(
            f"need one weight per model and at least one model, got {len(models)}, {len(weights)}"
        )
    total = math.fsum(weights)
    p = [w / total for w in weights]
    mean = weighted_sum(zip(p, models, strict=True))
    return math.fsum(p_i * math.sqrt(squared_norm(sub(m, mean))) for p_i, m in zip(p, models, strict=True))


def linearization_rmse(
    model: nn.Module, params0: Params, params: Params, x: torch.Tensor, batch_size: int = 1024
) -> float:
    """RMSE over ``x`` between f(theta) and f_lin(theta) = f(theta_0) + J(theta_0) (theta - theta_0).

    f_lin is the first-order Taylor expansion around the initial parameters (Lee et al., "Wide
    Neural Networks of Any Depth Evolve as Linear Models Under Gradient Descent", NeurIPS 2019,
    Eq. 4); the Jacobian-vector product comes from forward-mode autodiff (torch.func.jvp), so no
    Jacobian is formed. As in the authors' code (fedavg9.py), both are evaluated at the same
    parameters, the ones training reached.
    """
    anchor = {k: v.detach() for k, v in params0.items()}
    step = {k: params[k].detach() - v for k, v in anchor.items()}  # jvp wants anchor's key order
    squared, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(x), batch_size):
            chunk = x[s : s + batch_size]

            def f(p: Params, chunk: torch.Tensor = chunk) -> torch.Tensor:
                return functional_call(model, p, (chunk,))

            f0, tangent = jvp(f, (anchor,), (step,))
            diff = f(params) - (f0 + tangent)
            squared += float(diff.pow(2).sum())
            count += diff.numel()
    return math.sqrt(squared / count)


def linearized_fedavg(
    theta: torch.Tensor,
    f0: torch.Tensor,
    targets: torch.Tensor,
    clients: Sequence[Sequence[int]],
    lr: float,
    local_steps: int,
    rounds: int,
) -> torch.Tensor:
    """Outputs of the linearised network trained by FedAvg, in function space: the infinite-width
    prediction for a run that starts from the initialisation with kernel ``theta``.

    Full participation, ``local_steps`` full-batch gradient steps per client on the squared loss
    1/(2 N_i) sum_j ||f(x_j) - t_j||^2 (tasks/squared_error.py), sample-weighted averaging. A
    linearised model's parameter step moves its outputs by J dtheta, so client i's local step is
        f <- f - (lr / N_i) Theta[:, S_i] (f[S_i] - t[S_i])
    over all M points, and averaging parameters averages outputs. Centralized gradient descent is
    the same recursion with one client holding every training point (Jian & Liu's Thm 3 compares
    the two; their closed form is its gradient-flow limit).

    theta: (M*C, M*C) empirical NTK over M points, sample-major (tasks/ntk.py); f0: (M, C) outputs
    at initialisation; targets: (M, C), read only at training points; clients: each client's
    training points as indices into the M points. Returns the outputs after 0..rounds rounds,
    shape (rounds + 1, M, C).
    """
    m, c = f0.shape
    total = sum(len(points) for points in clients)
    rows = [torch.as_tensor(points, dtype=torch.int64) for points in clients]
    flat = [(r.unsqueeze(1) * c + torch.arange(c)).reshape(-1) for r in rows]  # (sample, output) rows
    f, t = f0.reshape(-1).to(theta.dtype), targets.reshape(-1).to(theta.dtype)
    trajectory = [f.clone()]
    for _ in range(rounds):
        averaged = torch.zeros_like(f)
        for points, index in zip(rows, flat, strict=True):
            local = f.clone()
            for _ in range(local_steps):
                local -= (lr / len(points)) * theta[:, index] @ (local[index] - t[index])
            averaged += (len(points) / total) * local
        f = averaged
        trajectory.append(f.clone())
    return torch.stack(trajectory).reshape(rounds + 1, m, c)

"""The empirical neural tangent kernel of a model, and how far it moves during training.

Jacot, Gabriel, Hongler, "Neural Tangent Kernel", NeurIPS 2018: Theta(x, x') = J(x) J(x')^T with
J = df/dtheta. Jian & Liu (ICML 2025) show that under FedAvg the global and the local NTK move by
O(n^{-1/2}) for width n (Thm 1) and plot ||Theta_t - Theta_0||_F / ||Theta_0||_F (Figs. 3-4).

Rows and columns are indexed by (sample, output), sample-major:
    Theta[i*C + c, j*C + d] = < df_c(x_i)/dtheta, df_d(x_j)/dtheta >.

How it is computed. A dense layer z = s_w a W^T + s_b b (s_w = s_b = 1 in PyTorch's
parameterisation, see tasks/layers.py) has per-sample gradients s_w delta a^T and s_b delta, so
its share of the kernel is exact and cheap:
    Theta_layer = (Delta Delta^T) * (s_w^2 A A^T + s_b^2)        (elementwise product)
with A the layer's inputs and Delta the gradients of the outputs with respect to z (one forward
and C backward passes, no Jacobian in memory; the "structured derivatives" of Novak, Sohl-
Dickstein, Schoenholz, "Fast Finite Width Neural Tangent Kernel", ICML 2022). That is what makes
widths in the thousands affordable. All other parameters (convolutions, normalisation, dense
layers called more than once or on inputs that are not (batch, features)) go through Jacobian
contraction with torch.func, ``vmap(jacrev)`` over samples, holding N * C * (their count) floats.
Both need a model that treats samples independently (no batch statistics).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from taciturn.core.params import Params


def empirical_ntk(model: nn.Module, params: Params, x: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """The (N*C, N*C) empirical NTK of ``model`` at ``params`` on the N inputs ``x``."""
    dense = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    captured: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    calls: Counter[str] = Counter()

    def capture(name: str):
        def hook(module, inputs, output):
            calls[name] += 1
            captured[name] = (inputs[0], output)

        return hook

    handles = [m.register_forward_hook(capture(name)) for name, m in dense.items()]
    try:
        with torch.enable_grad():
            leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            out = functional_call(model, leaves, (x,))
    finally:
        for handle in handles:
            handle.remove()
    out = out.reshape(len(x), -1)
    n, c = out.shape
    structured = [name for name in dense if calls[name] == 1 and captured[name][0].dim() == 2]
    theta = torch.zeros(n * c, n * c, dtype=out.dtype)
    if structured:
        zs = [captured[name][1] for name in structured]
        per_output = [torch.autograd.grad(out[:, k].sum(), zs, retain_graph=True) for k in range(c)]
        for layer, name in enumerate(structured):
            delta = torch.stack([grads[layer] for grads in per_output], dim=1).reshape(n * c, -1)
            inputs = captured[name][0].detach()
            module = dense[name]
            kernel = getattr(module, "weight_scale", 1.0) ** 2 * (inputs @ inputs.T)
            if module.bias is not None:
                kernel = kernel + getattr(module, "bias_scale", 1.0) ** 2
            kernel = kernel.repeat_interleave(c, dim=0).repeat_interleave(c, dim=1)
            theta += (delta @ delta.T) * kernel
    done = {f"{name}.{p}" for name in structured for p in ("weight", "bias")}
    rest = [k for k, _ in model.named_parameters() if k not in done]  # model order: same sums every run
    if rest:
        theta += _jacobian_ntk(model, params, rest, x, chunk)
    return theta.detach()


def _jacobian_ntk(model: nn.Module, params: Params, names: list[str], x: torch.Tensor, chunk: int):
    """J J^T over the parameters ``names`` by Jacobian contraction (the reference method)."""
    fixed = {k: v.detach() for k, v in params.items() if k not in names}
    free = {k: params[k].detach() for k in names}

    def f(free: Params, sample: torch.Tensor) -> torch.Tensor:
        return functional_call(model, {**fixed, **free}, (sample.unsqueeze(0),)).reshape(-1)

    jacobian = vmap(jacrev(f), in_dims=(None, 0))
    rows = []
    for start in range(0, len(x), chunk):
        jac = jacobian(free, x[start : start + chunk])  # name -> (b, C, *shape)
        rows.append(torch.cat([j.reshape(j.shape[0] * j.shape[1], -1) for j in jac.values()], dim=1))
    j = torch.cat(rows)
    return j @ j.T


def relative_change(before: torch.Tensor, after: torch.Tensor) -> float:
    """||after - before||_F / ||before||_F (Jian & Liu, Figs. 3-4, for the NTK)."""
    return float(torch.linalg.matrix_norm(after - before) / torch.linalg.matrix_norm(before))

"""Local minibatch training of one client: the reference implementation every executor matches.

The optimizer is SGD with PyTorch's semantics (torch.optim.SGD, dampening 0, no Nesterov):
    g <- clip(grad) + weight_decay * w;   b <- momentum * b + g;   w <- w - lr * b
where clip optionally rescales the gradient to a maximum global L2 norm (clip_grad_norm_).
Buffers (``ctx.buffers``: BatchNorm statistics) take no gradient and no optimizer step: the
forward pass updates them in place, and they come back with the trained parameters.
BatchNorm cannot normalise a batch of one sample in training, so with buffers such a step (the
tail of an epoch) is skipped, as ``DataLoader(drop_last=True)`` would.
Stochastic layers (dropout) draw from the global generator, seeded per (round, client).
"""

from __future__ import annotations

import torch

from taciturn.algorithms.base import Algorithm, ClientContext, LocalConfig, LocalTraining, TrainResult
from taciturn.core import device
from taciturn.core.params import Params


@torch.no_grad()
def sgd_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum: list[torch.Tensor] | None,
    config: LocalConfig,
) -> None:
    if config.clip_norm is not None:  # torch.nn.utils.clip_grad_norm_ before optimizer.step()
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        scale = config.clip_norm / (float(total) + 1e-6)
        if scale < 1.0:
            grads = torch._foreach_mul(grads, scale)
    if config.weight_decay:
        grads = torch._foreach_add(grads, params, alpha=config.weight_decay)
    if momentum is not None:
        torch._foreach_mul_(momentum, config.momentum)
        torch._foreach_add_(momentum, grads)
        grads = momentum
    torch._foreach_add_(params, grads, alpha=-config.lr)


def train_locally(
    algorithm: Algorithm, ctx: ClientContext, work: LocalTraining, config: LocalConfig
) -> TrainResult:
    names = [n for n in work.params if n not in ctx.buffers]
    params = [work.params[n].detach().clone().requires_grad_(True) for n in names]
    buffers = {n: work.params[n].detach().clone() for n in work.params if n in ctx.buffers}
    momentum = None
    if config.momentum > 0:
        start = work.momentum or {}
        momentum = [
            start[n].detach().clone() if n in start else torch.zeros_like(p)
            for n, p in zip(names, params, strict=True)
        ]
    gradient_sum = [torch.zeros_like(p) for p in params] if work.track_gradient else None
    total_loss, steps = 0.0, 0
    on = device.current()
    with torch.random.fork_rng(devices=[on.index or 0] if on.type == "cuda" else []):
        torch.manual_seed(ctx.streams.seed_for(ctx.round, ctx.client, "layers"))
        for indices in ctx.batch_indices(config):
            if ctx.buffers and len(indices) < 2:
                continue
            batch = ctx.data.batch(indices)
            current: Params = dict(zip(names, params, strict=True)) | buffers
            value = algorithm.objective(ctx.loss, current, batch, work.consts)
            grads = list(torch.autograd.grad(value, params))
            if gradient_sum is not None:
                torch._foreach_add_(gradient_sum, grads)
            sgd_step(params, grads, momentum, config)
            total_loss += float(value.detach())
            steps += 1
    return TrainResult(
        params={n: p.detach() for n, p in zip(names, params, strict=True)} | buffers,
        momentum=None if momentum is None else dict(zip(names, momentum, strict=True)),
        steps=steps,
        mean_loss=total_loss / max(steps, 1),
        mean_gradient=None
        if gradient_sum is None
        else {n: g / max(steps, 1) for n, g in zip(names, gradient_sum, strict=True)},
    )

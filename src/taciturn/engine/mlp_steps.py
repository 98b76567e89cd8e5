"""Local SGD on a ReLU MLP with the backward pass written out: the same steps, without autograd.

For cross-entropy and the task loss as the objective (FedAvg), one step of a client is
    forward    Z_k = A_k W_k^T + b_k,  A_{k+1} = relu(Z_k)
    output     G = (softmax(Z_last) - onehot(y)) / n          (the mean cross-entropy's gradient)
    backward   dW_k = G^T A_k,  db_k = sum of G's rows,  G <- (G W_k) * [Z_{k-1} > 0]
    update     torch.optim.SGD's (engine/optimizers.sgd): weight decay and momentum included
which is what autograd computes for train_locally, in fewer operations, with plain SGD's updates
fused into the products (addmm_). On a 784-200-200-10 MLP, one thread, a local step is 1.4x
quicker than through autograd at batch 32 and 1.75x at batch 10 (benchmarks/mlp_steps.py).
Results match the reference loop up to floating-point rounding (tests/test_executors.py).
Gradient clipping needs every gradient before any update, so it stays with autograd. This serves
clients the low-rank algebra does not (engine/lowrank.py: plain SGD where its corrections pay).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from taciturn.algorithms.base import Algorithm, ClientContext, LocalConfig, LocalTraining, TrainResult
from taciturn.core.params import strip_prefix, with_prefix
from taciturn.engine.optimizers import sgd


def applies(algorithm: Algorithm, task: object) -> bool:
    """Whether local training on this task is SGD (one learning rate through the round, fp32) on the
    task's cross-entropy of a ReLU MLP."""
    local = algorithm.config.local
    return (
        getattr(task, "mlp", None) is not None
        and type(algorithm).objective is Algorithm.objective
        and local.clip_norm is None
        and local.plain_sgd_steps
    )


def covers(algorithm: Algorithm, items: Sequence[tuple[ClientContext, LocalTraining]]) -> bool:
    """Whether these clients' work is that training, with no constants and no gradient tracking."""
    if not items:
        return False
    ctx, first = items[0]
    task = getattr(ctx.loss, "__self__", None)
    return applies(algorithm, task) and not first.consts and not first.track_gradient


@torch.no_grad()
def train_each(
    algorithm: Algorithm, items: Sequence[tuple[ClientContext, LocalTraining]], config: LocalConfig
) -> list[TrainResult]:
    return [_train(ctx, work, config) for ctx, work in items]


def _train(ctx: ClientContext, work: LocalTraining, config: LocalConfig) -> TrainResult:
    layers = ctx.loss.__self__.mlp  # type: ignore[attr-defined]  # (weight, bias) names, input to output
    start, lr, depth = work.params, config.round_lr(ctx.round), len(layers)
    names = [n for pair in layers for n in pair if n is not None]
    params = {n: start[n].clone() for n in names}
    buffers = None
    if config.momentum > 0:
        held = strip_prefix("momentum_buffer", work.optimizer_state or ctx.optimizer_state or {})
        buffers = {n: held[n].clone() if n in held else torch.zeros_like(params[n]) for n in names}
    weights = [params[w] for w, _ in layers]
    biases = [None if b is None else params[b] for _, b in layers]
    total_loss, steps = 0.0, 0
    for x, y in ctx.batches(config):
        inputs, outputs = [x.reshape(len(x), -1)], []
        for k in range(depth):
            w, b = weights[k], biases[k]
            z = inputs[k] @ w.T if b is None else torch.addmm(b, inputs[k], w.T)
            outputs.append(z)
            if k < depth - 1:
                inputs.append(torch.relu(z))
        log_p = torch.log_softmax(outputs[-1], dim=1)
        rows = torch.arange(len(y))
        total_loss -= float(log_p[rows, y].mean())
        g = log_p.exp_()
        g[rows, y] -= 1.0
        g /= len(y)
        for k in reversed(range(depth)):
            back = g @ weights[k] if k > 0 else None  # with this step's weights, before they move
            if buffers is None and not config.weight_decay:  # plain SGD: the update fused into the product
                weights[k].addmm_(g.T, inputs[k], alpha=-lr)
                if biases[k] is not None:
                    biases[k].add_(g.sum(dim=0), alpha=-lr)
            else:  # weight decay and momentum exactly as the reference loop applies them
                layer = [n for n in layers[k] if n is not None]
                grads = [g.T @ inputs[k]] + ([g.sum(dim=0)] if biases[k] is not None else [])
                held = None if buffers is None else [buffers[n] for n in layer]
                sgd([params[n] for n in layer], grads, held, config, lr)
            if back is not None:
                g = back.mul_(outputs[k - 1] > 0)
        steps += 1
    return TrainResult(
        params={n: params[n] for n in start},
        optimizer_state=None
        if buffers is None
        else with_prefix("momentum_buffer", {n: buffers[n] for n in start}),
        steps=steps,
        mean_loss=total_loss / max(steps, 1),
    )

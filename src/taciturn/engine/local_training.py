"""Local minibatch training of one client: the reference implementation every executor matches.

Each step takes the gradient of the algorithm's objective and applies the configured optimizer
(engine/optimizers.py: torch.optim's SGD, Adam or AdamW update) at the learning rate of that step:
``lr`` times the round's factor (``round_schedule``) times the step's (``schedule``, over the steps
this client takes in this round). With ``precision = "bf16"`` or ``"fp16"`` the objective's forward
pass runs under ``torch.autocast`` (the weights, gradients and optimizer state stay float32); fp16
scales the loss with ``torch.amp.GradScaler`` and skips a step whose gradients overflow, as its
documentation prescribes.

The optimizer's state is fresh every round (``optimizer_state = "reset"``: what FedAvg's clients
do, one new optimizer per round), or kept as client state (``"keep"``): the state a client's last
accepted round ended with (``ClientContext.optimizer_state``) is where its next starts, and the
pipeline stores the new one under ``optimizer/`` beside the algorithm's own state, staged like it
until the server accepts the client's update (DESIGN.md, "Acceptance"; ``end_training``).
An algorithm may start the optimizer from a state of its own (``LocalTraining.optimizer_state``).

Buffers (``ctx.buffers``: BatchNorm statistics) take no gradient and no optimizer step: the
forward pass updates them in place, and they come back with the trained parameters.
BatchNorm cannot normalise a batch of one sample in training, so with buffers such a step (the
tail of an epoch) is skipped, as ``DataLoader(drop_last=True)`` would.
Stochastic layers (dropout) draw from the global generator, seeded per (round, client).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from taciturn.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientOutput,
    LocalConfig,
    LocalTraining,
    TrainResult,
)
from taciturn.core import device
from taciturn.core.params import Params, strip_prefix, with_prefix
from taciturn.engine.optimizers import LocalOptimizer

OPTIMIZER = "optimizer"  # the prefix of a client's kept optimizer state in its stored state
PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(config: LocalConfig) -> contextlib.AbstractContextManager:
    """The forward pass's mixed precision (a no-op for fp32)."""
    if config.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.current().type, dtype=PRECISIONS[config.precision])


def train_locally(
    algorithm: Algorithm, ctx: ClientContext, work: LocalTraining, config: LocalConfig
) -> TrainResult:
    names = [n for n in work.params if n not in ctx.buffers]
    params = [work.params[n].detach().clone().requires_grad_(True) for n in names]
    buffers = {n: work.params[n].detach().clone() for n in work.params if n in ctx.buffers}
    optimizer = LocalOptimizer(config, names, params, work.optimizer_state or ctx.optimizer_state)
    on = device.current()
    scaled = _LossScaling(on, params, optimizer) if config.precision == "fp16" else None
    gradient_sum = [torch.zeros_like(p) for p in params] if work.track_gradient else None
    total_loss, steps = 0.0, 0
    round_lr = config.round_lr(ctx.round)
    with torch.random.fork_rng(devices=[on.index or 0] if on.type == "cuda" else []):
        torch.manual_seed(ctx.streams.seed_for(ctx.round, ctx.client, "layers"))
        plan = ctx.batch_indices(config)
        for t, indices in enumerate(plan):
            if ctx.buffers and len(indices) < 2:
                continue
            batch = ctx.data.batch(indices)
            current: Params = dict(zip(names, params, strict=True)) | buffers
            with autocast(config):
                value = algorithm.objective(ctx.loss, current, batch, work.consts)
            lr = round_lr * config.schedule.factor(t, len(plan))
            if scaled is None:
                grads = list(torch.autograd.grad(value, params))
                optimizer.step(params, grads, lr)
            else:
                grads = scaled.step_on(value, lr)
                if grads is None:  # an overflow: the scaler lowered its scale and skipped the step
                    continue
            if gradient_sum is not None:
                torch._foreach_add_(gradient_sum, grads)
            total_loss += float(value.detach())
            steps += 1
    return TrainResult(
        params={n: p.detach() for n, p in zip(names, params, strict=True)} | buffers,
        optimizer_state=optimizer.state(),
        steps=steps,
        mean_loss=total_loss / max(steps, 1),
        mean_gradient=None
        if gradient_sum is None
        else {n: g / max(steps, 1) for n, g in zip(names, gradient_sum, strict=True)},
    )


class _LossScaling(torch.optim.Optimizer):
    """fp16's dynamic loss scaling by ``torch.amp.GradScaler``, which drives torch optimizers: this
    shell shows it the parameters (their ``.grad``) and hands its ``step`` to the local optimizer."""

    def __init__(self, on: torch.device, params: list[torch.Tensor], optimizer: LocalOptimizer):
        super().__init__(params, {})
        self.params, self.optimizer, self.lr = params, optimizer, 0.0
        self.scaler = torch.amp.GradScaler(on.type)

    def step(self, closure: object = None) -> bool:  # called by the scaler when the gradients are finite
        self.optimizer.step(self.params, [p.grad for p in self.params], self.lr)
        return True

    def step_on(self, value: torch.Tensor, lr: float) -> list[torch.Tensor] | None:
        """Scale, unscale, step unless the gradients overflowed, update the scale; the unscaled
        gradients of a step taken, or None for a skipped one."""
        for p, g in zip(self.params, torch.autograd.grad(self.scaler.scale(value), self.params), strict=True):
            p.grad = g
        self.lr = lr
        self.scaler.unscale_(self)
        stepped = self.scaler.step(self)
        self.scaler.update()
        grads = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        return grads if stepped else None


# ----- the optimizer's state as client state (optimizer_state = "keep") -----
def split_state(state: Params | None) -> tuple[Params | None, Params | None]:
    """A stored client state as (the algorithm's part, the kept optimizer state)."""
    if state is None:
        return None, None
    head = OPTIMIZER + "/"
    own = {k: v for k, v in state.items() if not k.startswith(head)}
    kept = strip_prefix(OPTIMIZER, state)
    return (own if own or not kept else None), (kept or None)


def end_training(
    algorithm: Algorithm, ctx: ClientContext, work: LocalTraining, result: TrainResult
) -> ClientOutput:
    """The algorithm's ``client_end``; with ``optimizer_state = "keep"`` the client's new state also
    holds its optimizer's, so that it is staged, accepted and checkpointed with the algorithm's own."""
    output = algorithm.client_end(ctx, work, result)
    if algorithm.config.local.optimizer_state != "keep" or result.optimizer_state is None:
        return output
    own = output.state if output.state is not None else (ctx.state or {})
    return dataclasses.replace(output, state=dict(own) | with_prefix(OPTIMIZER, result.optimizer_state))

"""The vectorized executor: the local steps of many clients in one call.

Per-client parameters, momentum buffers and the algorithm's constants (prox anchors, control
variates, duals, per-client rho) are stacked along a leading client axis, and every local step is
one ``torch.func.vmap(grad_and_value(objective))`` over all clients of the round. Each client
keeps its own minibatch plan (the same seeded plan the sequential executor uses): at step t the
clients' batches are gathered with one indexing operation, padded to a common size with
zero-weight samples (the task's loss takes per-sample weights), and clients that have already
taken all their steps are masked out of the update (FedJAX's blockify-and-mask idea), so no client
takes an extra step. Results agree with the sequential executor up to floating-point summation
order (tests/test_executors.py states the tolerance).

On a GPU this is where most of the speed comes from; on a small CPU, distinct weights per client
make each step a small matrix product, so measure before choosing it (benchmarks/speed.py). For
plain local SGD on a ReLU MLP (FedAvg) the executor uses written-out algebra instead of vmap: the
exact shared-weight algebra of engine/lowrank.py, which reads no per-client weights during the
local steps, where it pays, else engine/mlp_steps.py's fused steps one client at a time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.func import grad_and_value, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from taciturn.algorithms.base import Algorithm, ClientContext, LocalConfig, LocalTraining, TrainResult
from taciturn.engine import lowrank, mlp_steps, optimizers
from taciturn.engine.executor import Executor
from taciturn.engine.local_training import autocast
from taciturn.engine.pipeline import RoundPart


class VmapTrainer:
    def train(
        self, algorithm: Algorithm, items: Sequence[tuple[ClientContext, LocalTraining]]
    ) -> list[TrainResult | Exception]:
        results: list[TrainResult | Exception | None] = [None] * len(items)
        for positions in _groups(items).values():
            group = [items[i] for i in positions]
            method = _method(algorithm, group)
            try:
                trained = method(algorithm, group, algorithm.config.local)
            except Exception as error:  # the whole group fails together
                trained = [error] * len(group)
            for i, result in zip(positions, trained, strict=True):
                results[i] = result
        return results  # type: ignore[return-value]


class VectorizedExecutor(Executor):
    name = "vectorized"

    def serve(self, round, clients, downlink, spec) -> RoundPart:
        return self.pipeline.serve(round, clients, downlink, spec, VmapTrainer())


def _method(algorithm: Algorithm, group: Sequence[tuple[ClientContext, LocalTraining]]):
    """Local SGD on a ReLU MLP runs as written-out algebra: across clients where it is plain SGD
    and the low-rank corrections pay, else one client at a time without autograd; anything else
    (another objective, clipping, algorithm constants) through vmap."""
    if lowrank.eligible(algorithm, group):
        return lowrank.train_group
    if mlp_steps.covers(algorithm, group):
        return mlp_steps.train_each
    return train_group


def _signature(work: LocalTraining) -> tuple:
    leaves, spec = tree_flatten(work.consts)
    shapes = tuple(tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else () for leaf in leaves)
    params = tuple(sorted((n, tuple(p.shape)) for n, p in work.params.items()))
    return params, str(spec), shapes, work.track_gradient


def _groups(items: Sequence[tuple[ClientContext, LocalTraining]]) -> dict[tuple, list[int]]:
    """Clients whose work has the same structure can share one vmapped call."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, (_, work) in enumerate(items):
        groups[_signature(work)].append(i)
    return groups


def _stack(trees: list[Any]) -> Any:
    leaves = [tree_flatten(t)[0] for t in trees]
    spec = tree_flatten(trees[0])[1]
    stacked = [torch.stack([torch.as_tensor(column[i]) for column in leaves]) for i in range(len(leaves[0]))]
    return tree_unflatten(stacked, spec)


def train_group(
    algorithm: Algorithm, group: Sequence[tuple[ClientContext, LocalTraining]], config: LocalConfig
) -> list[TrainResult]:
    contexts = [ctx for ctx, _ in group]
    names = list(group[0][1].params)
    params = {n: torch.stack([w.params[n] for _, w in group]).detach().clone() for n in names}
    consts = _stack([w.consts for _, w in group]) if group[0][1].consts else {}
    held = [w.optimizer_state or ctx.optimizer_state or {} for ctx, w in group]
    slots = {
        slot: {
            n: torch.stack(
                [
                    h.get(f"{slot}/{n}", torch.zeros_like(w.params[n]))
                    for h, (_, w) in zip(held, group, strict=True)
                ]
            )
            for n in names
        }
        for slot in optimizers.slots(config)
    }
    step_count = torch.tensor([float(h["step"]) if "step" in h else 0.0 for h in held], dtype=torch.float64)
    plans = [ctx.batch_indices(config) for ctx in contexts]
    steps = np.array([len(p) for p in plans])
    round_lr = np.array([config.round_lr(ctx.round) for ctx in contexts])
    data, loss = contexts[0].data, contexts[0].loss

    def objective(p, batch, c):
        return algorithm.objective(loss, p, batch, c)

    step_fn = vmap(grad_and_value(objective))
    track = group[0][1].track_gradient
    gradient_sum = {n: torch.zeros_like(p) for n, p in params.items()} if track else None
    loss_sum = torch.zeros(len(group), dtype=torch.float64)
    for t in range(int(steps.max())):
        active_np = steps > t
        active = torch.from_numpy(active_np)
        # Finished clients repeat their first batch (any valid batch avoids 0/0); their update is dropped.
        chosen = [plan[t] if a else plan[0] for plan, a in zip(plans, active_np, strict=True)]
        size = max(len(c) for c in chosen)
        index = np.zeros((len(group), size), dtype=np.int64)
        weight = np.zeros((len(group), size), dtype=np.float32)
        for i, c in enumerate(chosen):
            index[i, : len(c)] = c
            index[i, len(c) :] = c[0]
            weight[i, : len(c)] = 1.0
        flat = data.batch(index.reshape(-1))
        batch = (*(b.reshape(len(group), size, *b.shape[1:]) for b in flat), torch.from_numpy(weight))
        with autocast(config):
            grads, values = step_fn(params, batch, consts)
        loss_sum += torch.where(active, values.detach().double(), 0.0)
        if gradient_sum is not None:
            for n in names:
                gradient_sum[n] += _where(active, grads[n], 0.0)
        factors = [config.schedule.factor(t, int(n)) for n in steps]
        lr = torch.tensor(round_lr * np.array(factors), dtype=torch.float32)
        step_count += active.double()
        _optimizer_step(params, grads, slots, step_count, lr, config, active)
    divisor = torch.from_numpy(np.maximum(steps, 1))
    results = []
    for i in range(len(group)):
        state = {f"{slot}/{n}": held_[n][i] for slot, held_ in slots.items() for n in names}
        if slots and config.optimizer != "sgd":
            state["step"] = torch.tensor(float(step_count[i]), dtype=torch.float32)
        results.append(
            TrainResult(
                params={n: params[n][i] for n in names},
                optimizer_state=state or None,
                steps=int(steps[i]),
                mean_loss=float(loss_sum[i] / divisor[i]),
                mean_gradient=None
                if gradient_sum is None
                else {n: gradient_sum[n][i] / float(divisor[i]) for n in names},
            )
        )
    return results


def _where(active: torch.Tensor, value: torch.Tensor, other: Any) -> torch.Tensor:
    mask = active.reshape(-1, *([1] * (value.dim() - 1)))
    return torch.where(mask, value, other)


def _per_client(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (clients,) vector shaped to broadcast against ``like`` (clients, ...)."""
    return value.reshape(-1, *([1] * (like.dim() - 1))).to(like.dtype)


@torch.no_grad()
def _optimizer_step(params, grads, slots, step_count, lr, config: LocalConfig, active: torch.Tensor) -> None:
    """engine/optimizers.py's step for every client at once, each at its own learning rate and step
    count; inactive clients keep their values."""
    if config.clip_norm is not None:
        norms = torch.sqrt(sum(g.reshape(g.shape[0], -1).pow(2).sum(dim=1) for g in grads.values()))
        scale = torch.clamp(config.clip_norm / (norms + 1e-6), max=1.0)
        grads = {n: g * scale.reshape(-1, *([1] * (g.dim() - 1))) for n, g in grads.items()}
    decay = config.weight_decay
    if config.optimizer == "sgd":
        if decay:
            grads = {n: g + decay * params[n] for n, g in grads.items()}
        if "momentum_buffer" in slots:
            momentum = slots["momentum_buffer"]
            for n, g in grads.items():
                momentum[n].copy_(_where(active, config.momentum * momentum[n] + g, momentum[n]))
            grads = (
                {n: g + config.momentum * momentum[n] for n, g in grads.items()}
                if config.nesterov
                else momentum
            )
        for n, g in grads.items():
            params[n].copy_(_where(active, params[n] - _per_client(lr, g) * g, params[n]))
        return
    beta1, beta2 = config.betas
    steps = step_count.clamp(min=1.0)
    bias_correction1 = 1 - beta1**steps
    bias_correction2_sqrt = (1 - beta2**steps).sqrt()
    exp_avg, exp_avg_sq = slots["exp_avg"], slots["exp_avg_sq"]
    for n, g in grads.items():
        p = params[n]
        rate = _per_client(lr, p)
        if decay and config.optimizer == "adamw":
            p = _where(active, p * (1 - rate * decay), p)
        elif decay:
            g = g + decay * p
        m1 = exp_avg[n].lerp(g, 1 - beta1)
        m2 = exp_avg_sq[n] * beta2 + (1 - beta2) * g * g
        denom = m2.sqrt() / _per_client(bias_correction2_sqrt, p) + config.eps
        stepped = p - (rate / _per_client(bias_correction1, p)) * m1 / denom
        exp_avg[n].copy_(_where(active, m1, exp_avg[n]))
        exp_avg_sq[n].copy_(_where(active, m2, exp_avg_sq[n]))
        params[n].copy_(_where(active, stepped, params[n]))

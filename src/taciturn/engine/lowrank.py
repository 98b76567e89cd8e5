"""Exact many-client local SGD for ReLU MLPs: shared weights plus low-rank corrections.

Under plain SGD, a linear layer's weights after t local steps are
    W(t) = W(0) - lr * sum_{s<t} D(s)^T A(s),
with A(s) the layer's inputs and D(s) the loss gradient at its outputs on the batch of step s.
So for a client at step t, both products a training step needs split into a shared and a
per-client part:
    forward   A W(t)^T = A W(0)^T - lr * (A A_past^T) D_past
    backward  G W(t)   = G W(0)   - lr * (G D_past^T) A_past
The first terms use the round's common starting weights W(0) for every client at once: one large
matrix product over all clients' batches, which a CPU runs at full speed. The second terms are
small per-client products whose size grows with the samples seen so far (A_past, D_past stack the
earlier batches' rows). Nobody's weights are read or written at weight size until the end, where
each client's are formed once: W(0) - lr * D_past^T A_past. This is the exact algebra of the
sequential loop (tests/test_executors.py compares them); only floating-point summation order
differs. It pays when a client's local samples are fewer than the layer widths (cross-device
clients with tens of samples); with long local training the corrections outgrow the layer.

It applies to a plain ReLU MLP with the classification task's cross-entropy, an algorithm whose
local objective is the task loss (FedAvg), every client starting from the same weights, and plain
local SGD (no momentum, weight decay or clipping); ``eligible`` says whether a group qualifies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from taciturn.algorithms.base import Algorithm, ClientContext, LocalConfig, LocalTraining, TrainResult
from taciturn.engine import mlp_steps


def applies(algorithm: Algorithm, task: object) -> bool:
    """Whether this algorithm's local training on this task is the plain SGD the algebra covers."""
    return mlp_steps.applies(algorithm, task) and _plain(algorithm.config.local)


def _plain(config: LocalConfig) -> bool:
    return config.plain_sgd_steps and not config.momentum and not config.weight_decay


def pays(task: object, samples_per_client: float) -> bool:
    """Whether the per-client corrections cost fewer flops than the dense products they replace.

    At a step after s earlier samples, a layer with n inputs and m outputs costs a client about
    s (n + m) multiply-adds per row in corrections against n m in the dense product; s grows
    from 0 to the client's samples in a round, so on average it is half of them.
    """
    named = dict(task.model.named_parameters())  # type: ignore[attr-defined]
    shapes = [named[w].shape for w, _ in task.mlp]  # type: ignore[attr-defined]
    dense = sum(m * n for m, n in shapes)
    corrections = samples_per_client / 2 * sum(m + n for m, n in shapes)
    return corrections < dense


def local_samples(config: LocalConfig, client_size: float) -> float:
    """Samples a client visits in one round of local training."""
    return config.steps * config.batch_size if config.steps else config.epochs * client_size


def eligible(algorithm: Algorithm, items: Sequence[tuple[ClientContext, LocalTraining]]) -> bool:
    """Plain SGD, every client starting from the same weights, and corrections that pay."""
    if not (mlp_steps.covers(algorithm, items) and _plain(algorithm.config.local)):
        return False
    ctx, first = items[0]
    if not all(
        w.params.keys() == first.params.keys()
        and all(_same(w.params[n], first.params[n]) for n in first.params)
        for _, w in items[1:]
    ):
        return False
    samples = sum(local_samples(algorithm.config.local, c.num_samples) for c, _ in items) / len(items)
    return pays(ctx.loss.__self__, samples)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values; clients of one broadcast share its decoded memory, which is quicker to see."""
    shared = a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.stride() == b.stride()
    return a.shape == b.shape and (shared or torch.equal(a, b))


@torch.no_grad()
def train_group(
    algorithm: Algorithm, items: Sequence[tuple[ClientContext, LocalTraining]], config: LocalConfig
) -> list[TrainResult]:
    contexts = [ctx for ctx, _ in items]
    start = items[0][1].params
    layers = contexts[0].loss.__self__.mlp  # (weight, bias) names, input to output
    lr, clients, depth = config.round_lr(contexts[0].round), len(items), len(layers)
    plans = [ctx.batch_indices(config) for ctx in contexts]
    steps = np.array([len(p) for p in plans])
    rows = max(len(batch) for plan in plans for batch in plan)
    total = int(steps.max()) * rows
    weights = [start[w] for w, _ in layers]
    biases = [None if b is None else start[b].expand(clients, -1).clone() for _, b in layers]
    past_inputs = [torch.zeros(clients, total, w.shape[1], dtype=w.dtype) for w in weights]
    past_grads = [torch.zeros(clients, total, w.shape[0], dtype=w.dtype) for w in weights]
    loss_sum = torch.zeros(clients, dtype=torch.float64)
    data = contexts[0].data
    for t in range(int(steps.max())):
        active = steps > t
        index = np.zeros((clients, rows), dtype=np.int64)
        mask = np.zeros((clients, rows), dtype=np.float32)
        for i, plan in enumerate(plans):
            batch = plan[t] if active[i] else plan[0]  # finished clients compute on a dummy batch, masked out
            index[i, : len(batch)], index[i, len(batch) :] = batch, batch[0]
            mask[i, : len(batch)] = float(active[i])
        x, y = data.batch(index.reshape(-1))
        weight = torch.from_numpy(mask)
        count = weight.sum(dim=1).clamp(min=1.0)
        done, here = t * rows, slice(t * rows, (t + 1) * rows)
        # Forward: shared product with W(0) for all clients, minus each client's correction.
        inputs, outputs = [x.reshape(clients, rows, -1)], []
        for k, w in enumerate(weights):
            a = inputs[k]
            z = (a.reshape(clients * rows, -1) @ w.T).reshape(clients, rows, -1)
            if done:
                z -= lr * torch.bmm(
                    torch.bmm(a, past_inputs[k][:, :done].transpose(1, 2)), past_grads[k][:, :done]
                )
            if biases[k] is not None:
                z += biases[k][:, None, :]
            outputs.append(z)
            if k < depth - 1:
                inputs.append(F.relu(z))
        log_p = F.log_softmax(outputs[-1], dim=-1)
        nll = -log_p.gather(-1, y.reshape(clients, rows, 1)).squeeze(-1)
        loss_sum += torch.where(torch.from_numpy(active), ((nll * weight).sum(dim=1) / count).double(), 0.0)
        # Backward of the mean cross-entropy: (softmax - onehot) / n on each client's valid rows.
        g = log_p.exp()
        g.scatter_add_(-1, y.reshape(clients, rows, 1), -torch.ones(clients, rows, 1, dtype=g.dtype))
        g *= (weight / count[:, None])[..., None]
        for k in reversed(range(depth)):
            if k > 0:
                da = (g.reshape(clients * rows, -1) @ weights[k]).reshape(clients, rows, -1)
                if done:
                    da -= lr * torch.bmm(
                        torch.bmm(g, past_grads[k][:, :done].transpose(1, 2)), past_inputs[k][:, :done]
                    )
            past_inputs[k][:, here] = inputs[k]
            past_grads[k][:, here] = g
            if biases[k] is not None:
                biases[k] -= lr * g.sum(dim=1)
            if k > 0:
                g = da * (outputs[k - 1] > 0)
    # Each client's change W(t) - W(0) = -lr D_past^T A_past, formed directly (one product per layer
    # for all clients); its weights W(0) + change are formed only if something reads them.
    changes = [
        torch.baddbmm(w, past_grads[k].transpose(1, 2), past_inputs[k], beta=0, alpha=-lr)
        for k, w in enumerate(weights)
    ]
    results = []
    for i in range(clients):
        delta = {}
        for k, (w_name, b_name) in enumerate(layers):
            delta[w_name] = changes[k][i]
            if b_name is not None:
                delta[b_name] = biases[k][i] - start[b_name]
        delta = {n: delta[n] for n in start}
        results.append(
            TrainResult(
                params=_Offset(start, delta),
                optimizer_state=None,
                steps=int(steps[i]),
                mean_loss=float(loss_sum[i] / max(int(steps[i]), 1)),
                delta=delta,
            )
        )
    return results


class _Offset(Mapping[str, torch.Tensor]):
    """start + delta, each tensor formed when it is read (FedAvg reads only the delta)."""

    def __init__(self, start: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor]):
        self._start, self._delta = start, delta

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._start[name] + self._delta[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._delta)

    def __len__(self) -> int:
        return len(self._delta)

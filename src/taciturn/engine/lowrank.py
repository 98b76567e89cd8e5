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

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from taciturn.algorithms.base import Algorithm, ClientContext, LocalConfig, LocalTraining, TrainResult


def eligible(algorithm: Algorithm, items: Sequence[tuple[ClientContext, LocalTraining]]) -> bool:
    if not items:
        return False
    ctx, first = items[0]
    task = getattr(ctx.loss, "__self__", None)
    config = algorithm.config.local
    if (
        getattr(task, "mlp", None) is None
        or type(algorithm).objective is not Algorithm.objective
        or first.consts
        or first.track_gradient
        or config.momentum
        or config.weight_decay
        or config.clip_norm is not None
    ):
        return False
    return all(
        w.params.keys() == first.params.keys()
        and all(torch.equal(w.params[n], first.params[n]) for n in first.params)
        for _, w in items[1:]
    )


@torch.no_grad()
def train_group(
    algorithm: Algorithm, items: Sequence[tuple[ClientContext, LocalTraining]], config: LocalConfig
) -> list[TrainResult]:
    contexts = [ctx for ctx, _ in items]
    start = items[0][1].params
    layers = contexts[0].loss.__self__.mlp  # (weight, bias) names, input to output
    lr, clients, depth = config.lr, len(items), len(layers)
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
    results = []
    finals = [
        w - lr * torch.bmm(past_grads[k].transpose(1, 2), past_inputs[k]) for k, w in enumerate(weights)
    ]
    for i in range(clients):
        params = {}
        for k, (w_name, b_name) in enumerate(layers):
            params[w_name] = finals[k][i]
            if b_name is not None:
                params[b_name] = biases[k][i]
        results.append(
            TrainResult(
                params={n: params[n] for n in start},
                momentum=None,
                steps=int(steps[i]),
                mean_loss=float(loss_sum[i] / max(int(steps[i]), 1)),
            )
        )
    return results

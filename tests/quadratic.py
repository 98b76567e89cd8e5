"""Heterogeneous least squares: a federated problem whose optimum is known in closed form."""

from __future__ import annotations

import numpy as np
import torch

from taciturn.algorithms.base import Algorithm
from taciturn.compression.config import CompressionConfig
from taciturn.compression.link import Downlink, Uplink
from taciturn.core import Channel, Ledger, MemoryStateStore, Streams
from taciturn.data.datasets import ArrayDataset
from taciturn.data.federated import FederatedData
from taciturn.engine import ClientPipeline, Federation, SequentialExecutor


def least_squares_data(
    num_clients=5, dim=3, sizes=(20, 40, 30, 60, 25), seed=0, dtype=torch.float64
) -> FederatedData:
    """Client i's rows come from its own scale and offset, so local optima differ (heterogeneity)."""
    rng = np.random.default_rng(seed)
    xs, ys, parts, start = [], [], [], 0
    truth = rng.normal(size=dim)
    for i in range(num_clients):
        n = sizes[i % len(sizes)]
        a = rng.normal(size=(n, dim)) * (1 + 0.5 * i) + 0.5 * i
        b = a @ (truth + rng.normal(size=dim)) + rng.normal(size=n)
        xs.append(a)
        ys.append(b)
        parts.append(np.arange(start, start + n))
        start += n
    x = torch.tensor(np.concatenate(xs), dtype=dtype)
    y = torch.tensor(np.concatenate(ys), dtype=dtype)
    return FederatedData.from_parts(ArrayDataset("lsq", x, y, x[:1], y[:1], 1, "test"), parts)


def loss(params, batch):
    """f_i(w) = (1 / 2n) ||A w - b||^2 on a batch."""
    a, b = batch
    return 0.5 * ((a @ params["w"] - b) ** 2).mean()


def optimum(data: FederatedData, uniform: bool = False) -> torch.Tensor:
    """argmin_w sum_i p_i f_i(w), p_i = n_i / n (or 1/N)."""
    dim = data.dataset.x_train.shape[1]
    lhs, rhs = torch.zeros(dim, dim, dtype=torch.float64), torch.zeros(dim, dtype=torch.float64)
    for c in range(data.num_clients):
        a, b = data.batch(data.client_indices(c))
        p = 1 / data.num_clients if uniform else len(b) / data.num_samples
        lhs += p * a.T @ a / len(b)
        rhs += p * a.T @ b / len(b)
    return torch.linalg.solve(lhs, rhs)


def federation(
    algorithm: Algorithm, data: FederatedData, seed=0, drop_up=0.0, drop_down=0.0, compression=None
) -> Federation:
    """``compression``: a CompressionConfig (or its keys as a dict) for both links."""
    streams = Streams(seed)
    channel = Channel(Ledger(), streams, drop_up, drop_down)
    uplink = downlink = None
    if compression is not None:
        compression = CompressionConfig.model_validate(compression)
        up, down = compression.transform("up"), compression.transform("down")
        uplink = None if up is None else Uplink(up, streams)
        downlink = None if down is None else Downlink(down, streams)
    pipeline = ClientPipeline(
        algorithm, channel, MemoryStateStore(), streams, data, loss, uplink=uplink, downlink=downlink
    )
    return Federation(
        algorithm, SequentialExecutor(pipeline), streams, data, uplink=uplink, downlink=downlink
    )


def start(algorithm: Algorithm, data: FederatedData):
    dim = data.dataset.x_train.shape[1]
    return algorithm.init_server({"w": torch.zeros(dim, dtype=data.dataset.x_train.dtype)}, data.num_clients)


def run(fed: Federation, state, rounds: int, first: int = 1):
    for r in range(first, first + rounds):
        state, _ = fed.run_round(state, r)
    return state


class ExactXUpdate:
    """Mixin for ADMM algorithms: solve the x-update of least squares in closed form,
    argmin_x (1/2n)||A x - b||^2 + (rho_i/2)||x - z_hat + u||^2."""

    def x_update(self, ctx, z_hat, u):
        a, b = ctx.data.batch(ctx.data.client_indices(ctx.client))
        rho = self.rho_i(ctx)
        lhs = a.T @ a / len(b) + rho * torch.eye(a.shape[1], dtype=a.dtype)
        rhs = a.T @ b / len(b) + rho * (z_hat["w"] - u["w"])
        return self.finish(ctx, z_hat, u, {"w": torch.linalg.solve(lhs, rhs)}, {})

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from taciturn.algorithms.base import Arrival
from taciturn.algorithms.fedavg import FedAvg, FedAvgConfig, FedAvgState
from taciturn.core import Direction, Message
from taciturn.core.rng import SERVER
from taciturn.experiments.runner import prepare
from tests.conftest import tiny_config


def setup(tmp_path, **overrides):
    exp = prepare(tiny_config(**overrides), tmp_path)
    params = exp.task.init_params(exp.streams.torch(0, SERVER, "init"))
    return exp, exp.algorithm.init_server(params, exp.data.num_clients)


def test_one_client_one_full_batch_step_is_centralized_gradient_descent(tmp_path):
    exp, state = setup(
        tmp_path,
        partition={"kind": "iid", "num_clients": 1},
        algorithm={"name": "fedavg", "fraction": 1.0, "local": {"steps": 1, "batch_size": 10_000, "lr": 0.3}},
    )
    w0 = {k: v.clone().requires_grad_(True) for k, v in state.params.items()}
    x, y = exp.data.dataset.x_train, exp.data.dataset.y_train
    loss = F.cross_entropy(torch.func.functional_call(exp.task.model, w0, (x,)), y)
    grads = dict(zip(w0, torch.autograd.grad(loss, list(w0.values())), strict=True))
    new_state, report = exp.federation.run_round(state, 1)
    assert report.accepted == [0]
    for name, w in w0.items():
        torch.testing.assert_close(
            new_state.params[name], w.detach() - 0.3 * grads[name], rtol=1e-6, atol=1e-7
        )


def test_sample_weighted_average_matches_hand_computation():
    algorithm = FedAvg(FedAvgConfig(server_lr=0.5))
    state = FedAvgState({"w": torch.tensor([1.0, 1.0]), "b": torch.tensor([0.0])})

    def update(dw, db, n):
        return Message({"w": np.array(dw, np.float32), "b": np.array([db], np.float32)}, {"num_samples": n})

    arrivals = [Arrival(4, update([1.0, 2.0], 2.0, 1)), Arrival(9, update([4.0, -1.0], -2.0, 3))]
    new = algorithm.aggregate(state, 1, algorithm.accumulate(arrivals))
    # mean delta = (1*[1,2] + 3*[4,-1]) / 4 = [3.25, -0.25]; b: (2 - 6) / 4 = -1; server step 0.5
    torch.testing.assert_close(new.params["w"], torch.tensor([1.0 + 0.5 * 3.25, 1.0 - 0.5 * 0.25]))
    torch.testing.assert_close(new.params["b"], torch.tensor([-0.5]))
    assert algorithm.aggregate(state, 1, algorithm.accumulate([])) is state
    halves = algorithm.combine([algorithm.accumulate(arrivals[:1]), algorithm.accumulate(arrivals[1:])])
    torch.testing.assert_close(algorithm.aggregate(state, 1, halves).params["w"], new.params["w"])


@pytest.mark.parametrize("direction", ["drop_up", "drop_down"])
def test_a_channel_that_drops_everything_leaves_the_model_unchanged(tmp_path, direction):
    exp, state = setup(tmp_path, channel={direction: 1.0})
    before = {k: v.clone() for k, v in state.params.items()}
    for r in (1, 2, 3):
        state, report = exp.federation.run_round(state, r)
        assert report.accepted == []
    for k, v in before.items():
        assert torch.equal(state.params[k], v)
    down, up = exp.ledger.totals(Direction.DOWN), exp.ledger.totals(Direction.UP)
    assert down.messages_sent == 3 * 4  # 4 of 8 clients a round
    if direction == "drop_down":
        assert down.messages_delivered == 0 and up.messages_sent == 0
    else:
        assert down.messages_delivered == 12 and up.messages_sent == 12 and up.messages_delivered == 0


class Faulty(FedAvg):
    """FedAvg whose clients 0-3 send broken updates in four different ways."""

    seen: list[int]

    def client_end(self, ctx, work, result):
        out = super().client_end(ctx, work, result)
        arrays, meta = dict(out.uplink.arrays), dict(out.uplink.meta)
        name = sorted(arrays)[0]
        if ctx.client == 0:
            arrays[name] = np.full_like(arrays[name], np.nan)
        elif ctx.client == 1:
            arrays[name] = arrays[name].copy()
            arrays[name].flat[0] = np.inf
        elif ctx.client == 2:
            arrays[name] = np.zeros((3, 3), np.float32)
        elif ctx.client == 3:
            meta["num_samples"] = -5
        out.uplink = Message(arrays, meta)
        return out

    def accumulate(self, arrivals):
        self.seen = [a.client for a in arrivals]
        return super().accumulate(arrivals)


def test_malformed_or_nonfinite_updates_are_rejected_and_logged(tmp_path, caplog):
    exp, state = setup(tmp_path, algorithm={"name": "fedavg", "fraction": 1.0})
    faulty = Faulty(exp.algorithm.config)
    exp.federation.algorithm = exp.federation.executor.pipeline.algorithm = faulty
    with caplog.at_level(logging.WARNING):
        new_state, report = exp.federation.run_round(state, 1)
    reasons = dict(report.rejected)
    assert sorted(reasons) == [0, 1, 2, 3]
    assert "non-finite" in reasons[0] and "non-finite" in reasons[1]
    assert "shape" in reasons[2] and "num_samples" in reasons[3]
    assert faulty.seen == report.accepted == [4, 5, 6, 7]
    assert all(torch.isfinite(v).all() for v in new_state.params.values())
    assert sum("rejected the update of client" in r.message for r in caplog.records) == 4


def test_a_client_that_raises_does_not_stop_the_round(tmp_path):
    exp, state = setup(tmp_path, algorithm={"name": "fedavg", "fraction": 1.0})

    class Crashing(FedAvg):
        def client_begin(self, ctx):
            if ctx.client == 2:
                raise RuntimeError("disk full")
            return super().client_begin(ctx)

    crashing = Crashing(exp.algorithm.config)
    exp.federation.algorithm = exp.federation.executor.pipeline.algorithm = crashing
    _, report = exp.federation.run_round(state, 1)
    assert report.failed == [(2, "RuntimeError: disk full")]
    assert report.accepted == [0, 1, 3, 4, 5, 6, 7]


def test_clients_per_round():
    assert FedAvgConfig(fraction=0.1).clients_per_round(100) == 10
    assert FedAvgConfig(fraction=0.29).clients_per_round(100) == 29
    assert FedAvgConfig(fraction=0.01).clients_per_round(10) == 1

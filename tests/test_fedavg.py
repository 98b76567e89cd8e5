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
    assert FedAvgConfig(fraction=0.27).clients_per_round(10) == 2  # floor(2.7), not round(2.7)
    assert FedAvgConfig(fraction=1.0).clients_per_round(7) == 7


def test_client_end_sends_the_change_with_its_sample_count_and_a_finite_loss_only():
    from taciturn.algorithms.base import ClientContext, LocalTraining, TrainResult
    from taciturn.core import Streams

    algorithm = FedAvg(FedAvgConfig())
    ctx = ClientContext(2, 1, None, None, 7, Streams(0), None, None)
    work = LocalTraining(params={"w": torch.tensor([1.0, 2.0])}, consts={})
    out = algorithm.client_end(ctx, work, TrainResult({"w": torch.tensor([0.5, 3.0])}, None, 1, 0.25))
    assert out.state is None and dict(out.uplink.meta) == {"num_samples": 7, "train_loss": 0.25}
    assert out.uplink.arrays["w"].tolist() == [-0.5, 1.0]  # w^k - w_t
    state = FedAvgState({"w": torch.tensor([1.0, 2.0])})
    models = algorithm.client_models(state, [Arrival(2, out.uplink)])
    assert [(n, m["w"].tolist()) for n, m in models] == [(7.0, [-0.5, 1.0])]  # (n_k, w^k - w_t)
    # a non-finite mean loss is left out of the metadata; a trainer's own delta is sent as it is
    result = TrainResult({"w": torch.tensor([0.5, 3.0])}, None, 1, float("nan"), delta={"w": torch.ones(2)})
    out = algorithm.client_end(ctx, work, result)
    assert dict(out.uplink.meta) == {"num_samples": 7} and out.uplink.arrays["w"].tolist() == [1.0, 1.0]
    received = Message({"w": np.array([3.0, 4.0], np.float32)})
    work = algorithm.client_begin(ClientContext(2, 1, received, None, 7, Streams(0), None, None))
    assert work.params["w"].tolist() == [3.0, 4.0] and work.consts == {}
    assert algorithm.client_begin(ClientContext(2, 1, None, None, 7, Streams(0), None, None)).uplink is None


def test_positive_count_refuses_booleans_zero_negatives_floats_and_missing_values():
    from taciturn.algorithms.base import positive_count

    assert positive_count(Message({}, {"n": 1}), "n") is None
    for value in (True, 0, -3, 2.0):
        reason = positive_count(Message({}, {"n": value}), "n")
        assert reason == f"metadata 'n' must be a positive integer, got {value!r}"
    assert positive_count(Message({}, {}), "n") == "metadata 'n' must be a positive integer, got None"


def test_clients_are_sampled_without_replacement_and_sorted():
    algorithm = FedAvg(FedAvgConfig(fraction=0.5))
    for seed in range(50):
        picked = algorithm.select_clients(None, 1, 10, np.random.default_rng(seed)).tolist()
        assert len(picked) == 5 and picked == sorted(set(picked)) and picked[0] >= 0 and picked[-1] <= 9


def test_minibatches_come_from_the_clients_own_stream_for_the_round():
    """Two clients of 8 samples, batches of 3: each round is one pass over the client's own samples
    (3 + 3 + 2), in the order of batch_plan on the stream (round, client, "batches")."""
    from taciturn.algorithms.base import ClientContext, LocalConfig
    from taciturn.core import Streams
    from taciturn.data.batching import batch_plan
    from tests.quadratic import least_squares_data

    data = least_squares_data(num_clients=2, sizes=(8,))
    config = LocalConfig(batch_size=3)
    plans = {}
    for client in (0, 1):
        for round in (1, 2):
            ctx = ClientContext(client, round, None, None, 8, Streams(4), data, None)
            batches = ctx.batch_indices(config)
            own = data.client_indices(client)
            expected = batch_plan(8, 3, 1, None, Streams(4).numpy(round, client, "batches"))
            assert [b.tolist() for b in batches] == [own[p].tolist() for p in expected]
            assert [len(b) for b in batches] == [3, 3, 2]
            assert sorted(np.concatenate(batches).tolist()) == own.tolist()
            first = next(ctx.batches(config))
            assert torch.equal(first[0], data.batch(batches[0])[0])
            plans[client, round] = [p.tolist() for p in expected]
    assert plans[0, 1] != plans[0, 2] and plans[0, 1] != plans[1, 1]  # each round and client its own


def test_fedbn_buffers_make_fedavg_stateful_and_never_travel_up():
    from taciturn.algorithms.base import ClientContext, TrainResult
    from taciturn.core import Streams

    algorithm = FedAvg(FedAvgConfig())
    assert algorithm.keeps_client_state is False and algorithm.local_buffers == frozenset()
    algorithm.use_buffers(frozenset({"bn"}), local=True)
    assert algorithm.keeps_client_state is True and algorithm.local_buffers == frozenset({"bn"})
    state = FedAvgState({"w": torch.zeros(2), "bn": torch.zeros(3)})
    assert list(algorithm.uplink_spec(state)) == ["w"]
    received = Message({"w": np.array([1.0, 2.0], np.float32), "bn": np.zeros(3, np.float32)})
    own = {"buffers/bn": torch.tensor([5.0, 6.0, 7.0])}
    first = algorithm.client_begin(ClientContext(0, 1, received, None, 4, Streams(0), None, None))
    assert first.params["bn"].tolist() == [0.0, 0.0, 0.0]  # first round: the broadcast's statistics
    work = algorithm.client_begin(ClientContext(0, 2, received, own, 4, Streams(0), None, None))
    assert work.params["w"].tolist() == [1.0, 2.0] and work.params["bn"].tolist() == [5.0, 6.0, 7.0]
    trained = {"w": torch.tensor([0.0, 2.5]), "bn": torch.tensor([1.0, 1.0, 1.0])}
    out = algorithm.client_end(
        ClientContext(0, 2, received, own, 4, Streams(0), None, None),
        work,
        TrainResult(trained, None, 1, 0.5),
    )
    assert list(out.uplink.arrays) == ["w"] and out.uplink.arrays["w"].tolist() == [-1.0, 0.5]
    assert list(out.state) == ["buffers/bn"] and out.state["buffers/bn"].tolist() == [1.0, 1.0, 1.0]
    algorithm.use_buffers(frozenset())
    assert algorithm.keeps_client_state is False

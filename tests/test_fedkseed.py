"""FedKSeed: zeroth-order steps along seeded directions, scalar uplinks, replay from the history."""

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import Arrival, ClientContext
from taciturn.algorithms.fedkseed import FedKSeed, FedKSeedConfig, perturb
from taciturn.core import Message, Streams
from taciturn.core.state_store import MemoryStateStore

TARGET = torch.tensor([1.0, -2.0, 0.5, 3.0])


class Samples:
    """Four samples per client; the loss ignores them (a quadratic in the parameters)."""

    num_clients = 3

    def client_size(self, client):
        return 4

    def client_indices(self, client):
        return np.arange(4)

    def batch(self, indices):
        return None


def quadratic(params, batch):
    return 0.5 * (params["w"].double() - TARGET.double()).pow(2).sum()


def make(steps=1, lr=0.1, seeds=8):
    algorithm = FedKSeed(
        FedKSeedConfig(seeds=seeds, epsilon=1e-3, local={"steps": steps, "batch_size": 4, "lr": lr})
    )
    algorithm.use_streams(Streams(0))
    return algorithm, algorithm.init_server({"w": torch.zeros(4)}, 3)


def context(algorithm, client, round, received, state=None):
    return ClientContext(client, round, received, state, 4, algorithm.streams, Samples(), quadratic)


def direction(seed):
    z = {"w": torch.zeros(4)}
    perturb(z, Streams(0), seed, 1.0)
    return z["w"]


def test_one_zeroth_order_step_matches_the_hand_computation():
    algorithm, state = make()
    down = algorithm.downlink(state, 1, [0])[0]
    out = algorithm.client_begin(context(algorithm, 0, 1, down))
    (seed,) = out.uplink.arrays["seeds"].tolist()
    z = direction(seed)
    # the central difference of a quadratic is exact: g = z . (w - target) at w = 0
    g = float(z @ (torch.zeros(4) - TARGET))
    assert out.uplink.arrays["grads"][0] == pytest.approx(g, rel=1e-4)
    seed_picked = Streams(0).numpy(1, 0, "fedkseed-pick").integers(8)
    assert seed == seed_picked
    new = algorithm.aggregate(state, 1, [Arrival(0, out.uplink)])
    torch.testing.assert_close(new.params["w"], -0.1 * float(out.uplink.arrays["grads"][0]) * z)
    assert float(new.history[0, seed]) == out.uplink.arrays["grads"][0]
    assert torch.equal(out.state["params/w"], torch.zeros(4))  # the client keeps the model it synced to


def test_many_steps_descend_and_the_uplink_holds_one_scalar_per_seed_used():
    algorithm, state = make(steps=200, lr=0.05, seeds=16)
    out = algorithm.client_begin(context(algorithm, 0, 1, algorithm.downlink(state, 1, [0])[0]))
    seeds = out.uplink.arrays["seeds"]
    assert len(seeds) == len(set(seeds.tolist())) <= 16 and (np.diff(seeds) > 0).all()
    new = algorithm.aggregate(state, 1, [Arrival(0, out.uplink)])
    assert float(quadratic(new.params, None)) < 0.2 * float(quadratic({"w": torch.zeros(4)}, None))


def test_server_averages_scalars_and_rejects_malformed_uplinks():
    algorithm, state = make()
    a = Message(
        {"seeds": np.array([1, 3], np.int32), "grads": np.array([2.0, 4.0], np.float32)}, {"num_samples": 4}
    )
    b = Message({"seeds": np.array([3], np.int32), "grads": np.array([-2.0], np.float32)}, {"num_samples": 4})
    new = algorithm.aggregate(state, 1, [Arrival(0, a), Arrival(1, b)])
    torch.testing.assert_close(new.history[0, [1, 3]], torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(new.params["w"], -0.1 * (direction(1) + direction(3)))
    bad = [
        Message({"seeds": np.array([3, 1], np.int32), "grads": np.ones(2, np.float32)}, {"num_samples": 4}),
        Message({"seeds": np.array([8], np.int32), "grads": np.ones(1, np.float32)}, {"num_samples": 4}),
        Message({"seeds": np.array([1], np.int32), "grads": np.ones(2, np.float32)}, {"num_samples": 4}),
    ]
    assert all(algorithm.check_uplink_meta(m) is not None for m in bad)
    assert algorithm.check_uplink_meta(a) is None


def test_a_client_that_missed_rounds_replays_the_scalars_to_the_servers_model():
    algorithm, state = make(steps=3)
    store = MemoryStateStore()
    for round in (1, 2, 3):
        clients = [0, 1, 2] if round == 1 else [1, 2]
        down = algorithm.downlink(state, round, clients)
        arrivals = []
        for c in clients:
            out = algorithm.client_begin(context(algorithm, c, round, down[c], store.get(c)))
            store.put(c, out.state)
            arrivals.append(Arrival(c, out.uplink))
        state = algorithm.aggregate(state, round, arrivals)
    down = algorithm.downlink(state, 4, [0])[0]
    assert down.meta["first_round"] == 1 and len(down.arrays["counts"]) == 3  # rounds 1-3
    out = algorithm.client_begin(context(algorithm, 0, 4, down, store.get(0)))
    assert torch.equal(out.state["params/w"], state.params["w"])  # bit-identical replay
    assert out.state["synced_round"] == 3


def test_fedkseed_takes_plain_steps_only():
    with pytest.raises(ValueError, match="momentum"):
        FedKSeedConfig(local={"momentum": 0.9})


def test_uplink_checks_at_their_boundaries():
    algorithm, _ = make(seeds=8)

    def uplink(seeds, n=4):
        seeds = np.array(seeds, np.int32)
        return Message({"seeds": seeds, "grads": np.ones(len(seeds), np.float32)}, {"num_samples": n})

    assert algorithm.check_uplink_meta(uplink([0, 7])) is None  # the first and the last seed
    assert algorithm.check_uplink_meta(uplink([])) is None  # no step changed anything
    for seeds in ([-1, 2], [2, 8], [3, 3]):  # below, above, repeated
        assert algorithm.check_uplink_meta(uplink(seeds)) == "seeds must be distinct, ascending and in [0, 8)"
    assert (
        algorithm.check_uplink_meta(
            Message({"seeds": np.array([1], np.int32), "grads": np.ones(2, np.float32)}, {"num_samples": 4})
        )
        == "1 seeds but 2 scalar gradients"
    )
    assert "num_samples" in algorithm.check_uplink_meta(uplink([1], n=0))
    assert algorithm.client_begin(context(algorithm, 0, 1, None)).uplink is None  # nothing arrived


@pytest.mark.parametrize("local", [{"weight_decay": 0.1}, {"clip_norm": 1.0}])
def test_fedkseed_refuses_weight_decay_and_clipping_too(local):
    with pytest.raises(ValueError, match=r"remove algorithm\.local\.momentum, weight_decay and clip_norm"):
        FedKSeedConfig(local=local)

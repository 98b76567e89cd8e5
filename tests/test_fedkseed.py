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


def make(steps=1, lr=0.1, seeds=8, replay_cache_mib=1024):
    algorithm = FedKSeed(
        FedKSeedConfig(
            seeds=seeds,
            epsilon=1e-3,
            local={"steps": steps, "batch_size": 4, "lr": lr},
            replay_cache_mib=replay_cache_mib,
        )
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


@pytest.mark.parametrize("cache_mib", [0, 1])
def test_a_client_that_missed_rounds_replays_the_scalars_to_the_servers_model(cache_mib):
    """The same bits whether the rounds' steps are kept (1 MiB holds them all) or regenerated (0).
    Kept steps serve every replay: in rounds 2 and 3 client 1 replays the previous round (a client
    holds the model it started its round from) and client 2 shares its result (replay.CaughtUp);
    in round 4 client 0 replays rounds 1-3."""
    algorithm, state = make(steps=3, replay_cache_mib=cache_mib)
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
    assert algorithm.cache.hits == (0 if cache_mib == 0 else 1 + 1 + 3)


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
    with pytest.raises(ValueError, match=r"remove algorithm\.local\.momentum, weight_decay, clip_norm"):
        FedKSeedConfig(local=local)


def test_a_client_whose_copy_disagrees_with_the_history_is_refused_with_both_rounds():
    from taciturn.algorithms.replay import check_caught_up

    check_caught_up(3, 4, 5)  # round 5 starts from round 4's model
    for held in (3, 5):
        with pytest.raises(ValueError) as refused:
            check_caught_up(3, held, 5)
        assert str(refused.value) == (
            f"client 3 holds the model of round {held}, but round 5 starts from round 4: "
            "the server's history and the client's copy disagree"
        )


def test_the_downlink_carries_every_nonzero_scalar_since_the_clients_round_even_a_scalar_of_one():
    algorithm, state = make()
    a = Message(
        {"seeds": np.array([1, 3], np.int32), "grads": np.array([2.0, 4.0], np.float32)}, {"num_samples": 4}
    )
    b = Message(
        {"seeds": np.array([3, 5], np.int32), "grads": np.array([-2.0, 0.5], np.float32)}, {"num_samples": 4}
    )
    state = algorithm.aggregate(state, 1, [Arrival(0, a), Arrival(1, b)])  # G = 1, 1, 0.25 at 1, 3, 5
    state = algorithm.aggregate(state, 2, [Arrival(1, b)])  # G = -2, 0.5 at 3, 5
    assert state.synced.tolist() == [0, 1, 0]  # an uplink of round r proves the client held round r - 1
    down = algorithm.downlink(state, 3, [0, 1, 2])
    assert down[0] is down[2] and down[0].meta["first_round"] == 1  # same position, one message
    assert down[0].arrays["counts"].tolist() == [3, 2]
    assert down[0].arrays["seeds"].tolist() == [1, 3, 5, 3, 5]
    assert down[0].arrays["grads"].tolist() == [1.0, 1.0, 0.25, -2.0, 0.5]
    assert down[1].meta["first_round"] == 2 and down[1].arrays["counts"].tolist() == [2]
    assert down[1].arrays["seeds"].tolist() == [3, 5] and down[1].arrays["grads"].tolist() == [-2.0, 0.5]


def test_adjacent_seeds_are_accepted_and_a_stale_copy_is_refused_with_the_clients_name():
    algorithm, state = make(seeds=8)
    adjacent = Message(
        {"seeds": np.array([2, 3], np.int32), "grads": np.ones(2, np.float32)}, {"num_samples": 4}
    )
    assert algorithm.check_uplink_meta(adjacent) is None
    down = algorithm.downlink(state, 1, [2])[2]  # the history from round 1 on
    ahead = {"synced_round": torch.tensor(1), "params/w": torch.zeros(4)}  # claims round 1 already
    with pytest.raises(
        ValueError, match=r"^client 2 holds the model of round 1, but round 1 starts from round 0"
    ):
        algorithm.client_begin(context(algorithm, 2, 1, down, ahead))
    short = algorithm.downlink(state, 1, [2])[2]  # no round of history, yet the client is in round 3
    with pytest.raises(
        ValueError, match=r"^client 2 holds the model of round 0, but round 3 starts from round 2"
    ):
        algorithm.client_begin(context(algorithm, 2, 3, short))
    with pytest.raises(AssertionError) as refused:
        algorithm.client_end(None, None, None)
    assert str(refused.value) == "FedKSeed clients train in client_begin (zeroth-order steps)"


def test_each_seed_is_a_fixed_gaussian_direction_drawn_tensor_by_tensor_from_its_run_stream():
    from taciturn.core.rng import SERVER

    params = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    perturb(params, Streams(5), 6, 0.5)
    generator = Streams(5).torch(0, SERVER, "fedkseed-seed/6")  # round 0: the same for the whole run
    a, b = torch.randn(2, 3, generator=generator), torch.randn(4, generator=generator)
    assert torch.equal(params["a"], 0.5 * a) and torch.equal(params["b"], 0.5 * b)
    unstarted = FedKSeed(FedKSeedConfig(seeds=8))
    unstarted.use_streams(Streams(0))
    with pytest.raises(AssertionError):  # init_server gives every client its w_0 first
        unstarted.client_begin(context(unstarted, 0, 1, Message({}, {"first_round": 1})))
    _, state = make()
    assert state.synced.dtype == torch.int64 and state.synced.tolist() == [0, 0, 0]
    assert state.history.shape == (0, 8)

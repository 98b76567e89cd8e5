"""Event-based ADMM: convergence on a convex problem, exact triggers, drops and resets."""

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import ClientContext
from taciturn.algorithms.event_admm import EventADMM, EventADMMConfig
from taciturn.core import Direction, Message, Streams
from tests.quadratic import ExactXUpdate, federation, least_squares_data, optimum, run, start


class ExactEventADMM(ExactXUpdate, EventADMM):
    pass


def error_after(rounds, **config):
    data = least_squares_data()
    algorithm = ExactEventADMM(EventADMMConfig(**config))
    fed = federation(algorithm, data)
    state = run(fed, start(algorithm, data), rounds)
    return float(torch.linalg.norm(state.z["w"] - optimum(data))), fed


def test_delta_zero_converges_to_the_consensus_optimum():
    # rho_i = rho / (N p_i): the consensus is the sample-weighted least-squares optimum.
    err, _ = error_after(200, rho=2.0)
    assert err < 1e-8


@pytest.mark.parametrize("relaxation", [1.0, 1.5])
def test_over_relaxation_converges_too(relaxation):
    err, _ = error_after(200, rho=2.0, relaxation=relaxation)
    assert err < 1e-8


def test_positive_delta_stops_within_a_floor_that_grows_with_delta():
    errors, loads = [], []
    for delta in (1e-3, 1e-2, 1e-1):
        err, fed = error_after(200, rho=2.0, delta=delta, delta_z=delta / 100)
        errors.append(err)
        loads.append(fed.executor.pipeline.channel.ledger.totals(Direction.UP).messages_sent)
    exact, _ = error_after(200, rho=2.0)
    assert exact < errors[0] < errors[1] < errors[2]
    assert errors[2] < 10 * 0.1  # O(Delta), with a modest constant here
    assert loads[0] > loads[1] > loads[2]  # larger thresholds talk less
    assert loads[0] < 5 * 200  # and even the smallest one goes silent at some point


def test_a_decreasing_delta_keeps_converging():
    constant, _ = error_after(300, rho=2.0, delta=0.1, delta_z=0.001)
    decaying, _ = error_after(300, rho=2.0, delta=0.1, delta_z=0.001, delta_decay=0.97)
    assert decaying < constant / 100


def ctx_for(state, received, round=3):
    data = least_squares_data()
    return ClientContext(0, round, received, state, 20, Streams(0), data, lambda p, b: 0)


def test_uplink_trigger_fires_exactly_at_the_threshold():
    z = {"w": torch.zeros(2, dtype=torch.float64)}
    x = {"w": torch.tensor([3.0, 4.0], dtype=torch.float64)}  # ||v - last|| = 5 with u = 0, last = 0
    for delta, fires in ((5.0, True), (5.0 + 1e-12, False), (4.999, True)):
        algorithm = EventADMM(EventADMMConfig(delta=delta))
        out = algorithm.finish(ctx_for({}, None), z, {"w": torch.zeros(2, dtype=torch.float64)}, x, None, {})
        assert (out.uplink is not None) == fires
        assert torch.equal(out.state["last/w"], x["w"] if fires else z["w"])


def test_downlink_trigger_fires_exactly_at_the_threshold():
    algorithm = EventADMM(EventADMMConfig(delta=1.0, delta_z=0.5))
    state = algorithm.init_server({"w": torch.zeros(2, dtype=torch.float64)}, 2)
    v = Message({"w": np.array([0.6, 0.8])})  # z = v / 2 (the other copy stays 0): ||z - z_sent|| = 0.5
    from taciturn.algorithms.base import Arrival

    assert algorithm.aggregate(state, 1, [Arrival(0, v)]).broadcast
    state = algorithm.init_server({"w": torch.zeros(2, dtype=torch.float64)}, 2)
    algorithm.config.__dict__["delta_z"] = 0.5 + 1e-12
    assert not algorithm.aggregate(state, 1, [Arrival(0, v)]).broadcast


def test_silence_costs_zero_bytes():
    _, fed = error_after(3, rho=2.0, delta=1e6, delta_z=1e6)
    ledger = fed.executor.pipeline.channel.ledger
    assert ledger.totals(Direction.UP).bytes_sent == 0
    # Round 1 syncs z^0 to every agent; after that the server has nothing new to say either.
    assert ledger.totals(Direction.DOWN).messages_sent == 5
    assert ledger.rows([2, 3]) == []


def test_randomized_variant_sends_z_to_a_fraction_when_silent():
    algorithm = EventADMM(EventADMMConfig(lucky_fraction=0.3))
    algorithm.use_streams(Streams(0))
    state = algorithm.init_server({"w": torch.zeros(2)}, 10)
    state.broadcast = False
    sent = algorithm.downlink(state, 2, list(range(10)))
    assert len(sent) == 3 and all(isinstance(c, int) for c in sent)
    assert sent.keys() == algorithm.downlink(state, 2, list(range(10))).keys()  # drawn from the run's streams
    assert EventADMM(EventADMMConfig()).downlink(state, 2, list(range(10))) == {}


def test_per_agent_rho_is_rho_over_n_p_i():
    data = least_squares_data()  # sizes 20, 40, 30, 60, 25: n = 175, N = 5
    algorithm = EventADMM(EventADMMConfig(rho=2.0))
    ctx = ClientContext(1, 1, None, None, 40, Streams(0), data, None)
    assert algorithm.rho_i(ctx) == pytest.approx(2.0 / (5 * 40 / 175))
    assert EventADMM(EventADMMConfig(rho=2.0, per_agent_rho=False)).rho_i(ctx) == 2.0


def test_dual_update_uses_the_newest_z_held_and_momentum_persists():
    algorithm = EventADMM(EventADMMConfig(local={"momentum": 0.9}))
    held = {
        "x_hat/w": torch.tensor([1.0]),
        "u/w": torch.tensor([0.5]),
        "z_hat/w": torch.tensor([0.0]),
        "last/w": torch.tensor([0.0]),
        "momentum/w": torch.tensor([7.0]),
    }
    work = algorithm.client_begin(ctx_for(held, Message({"w": np.array([2.0], np.float32)})))
    torch.testing.assert_close(work.consts["u"]["w"], torch.tensor([0.5 + 1.0 - 2.0]))  # u + x_hat - z
    torch.testing.assert_close(work.consts["anchor"]["w"], torch.tensor([2.0 - (-0.5)]))  # z - u
    torch.testing.assert_close(work.params["w"], torch.tensor([2.0]))  # warm start from z
    assert work.momentum["w"].item() == 7.0
    stale = algorithm.client_begin(ctx_for(held, None))  # nothing arrived: keep the held z
    torch.testing.assert_close(stale.params["w"], torch.tensor([0.0]))


def test_everything_dropped_and_no_reset_changes_nothing():
    data = least_squares_data()
    algorithm = ExactEventADMM(EventADMMConfig(rho=2.0))
    fed = federation(algorithm, data, drop_up=1.0, drop_down=1.0)
    state = start(algorithm, data)
    z0 = state.z["w"].clone()
    state = run(fed, state, 5)
    assert torch.equal(state.z["w"], z0)
    assert fed.executor.pipeline.channel.ledger.totals(Direction.UP).messages_delivered == 0


def test_a_reset_makes_all_copies_agree_again():
    data = least_squares_data()
    algorithm = ExactEventADMM(EventADMMConfig(rho=2.0, delta=0.05, delta_z=0.05, reset_every=5))
    fed = federation(algorithm, data, drop_up=0.5, drop_down=0.5)

    def copies_agree(state, z_broadcast):
        held = [fed.executor.pipeline.store.get(c) for c in range(5)]
        return all(
            h is not None
            and torch.equal(state.copies["w"][c], h["last/w"])  # the server's copy of x_hat + u
            and torch.equal(h["z_hat/w"], z_broadcast["w"])  # the agent's copy of z
            for c, h in enumerate(held)
        )

    state = run(fed, start(algorithm, data), 4)
    z_before = {"w": state.z["w"].clone()}
    assert not copies_agree(state, state.z)  # drops and triggers left stale copies behind
    fed.executor.pipeline.channel.drop = {Direction.UP: 0.0, Direction.DOWN: 0.0}
    state = run(fed, state, 1, first=5)  # the reset round: z to everyone, every full vector back
    assert copies_agree(state, z_before)
    assert fed.executor.pipeline.channel.ledger.round_totals(5, Direction.UP).messages_sent == 5
    assert fed.executor.pipeline.channel.ledger.round_totals(5, Direction.DOWN).messages_sent == 5

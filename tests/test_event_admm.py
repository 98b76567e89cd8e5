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
        out = algorithm.finish(ctx_for({}, None), z, {"w": torch.zeros(2, dtype=torch.float64)}, x, {})
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


def test_dual_update_uses_the_newest_z_held():
    algorithm = EventADMM(EventADMMConfig(local={"momentum": 0.9}))
    held = {
        "x_hat/w": torch.tensor([1.0]),
        "u/w": torch.tensor([0.5]),
        "z_hat/w": torch.tensor([0.0]),
        "last/w": torch.tensor([0.0]),
    }
    work = algorithm.client_begin(ctx_for(held, Message({"w": np.array([2.0], np.float32)})))
    torch.testing.assert_close(work.consts["u"]["w"], torch.tensor([0.5 + 1.0 - 2.0]))  # u + x_hat - z
    torch.testing.assert_close(work.consts["anchor"]["w"], torch.tensor([2.0 - (-0.5)]))  # z - u
    torch.testing.assert_close(work.params["w"], torch.tensor([2.0]))  # warm start from z
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


def w(*values):
    return {"w": torch.tensor(values, dtype=torch.float64)}


def test_the_three_trigger_units_and_the_remembered_z_step_by_hand():
    """last = (3, 4): ||last|| = 5; a new z 0.5 away from the held one; N = 5 agents."""
    held = {"z_hat/w": w(0.0, 0.0)["w"], "last/w": w(3.0, 4.0)["w"], "z_step": torch.tensor(0.8)}
    algorithm = EventADMM(EventADMMConfig(delta=0.5, trigger="relative", progress_fade=0.25))
    ctx = ctx_for(held, None)
    assert algorithm.z_step(ctx, w(0.3, 0.4)) == pytest.approx(0.5, rel=1e-12)
    assert algorithm.z_step(ctx, w(0.0, 0.0)) == pytest.approx(0.25 * 0.8, rel=1e-6)  # nothing new: fade
    assert algorithm.z_step(ctx_for({"z_hat/w": w(0.0, 0.0)["w"]}, None), w(0.0, 0.0)) == 0.0  # unknown
    assert algorithm.z_step(ctx_for({}, None), w(0.3, 0.4)) == 0.0  # no z held yet
    units = algorithm.trigger_units(ctx, w(3.0, 4.0), 0.5)
    assert units == {"absolute": 1.0, "relative": pytest.approx(5.0), "progress": pytest.approx(2.5)}
    # relative: send iff ||v - last|| >= Delta ||last|| = 2.5; v = x + u = (4.5, 6) is 2.5 from last
    for delta, fires in ((0.5, True), (0.5 + 1e-9, False)):
        relative = EventADMM(EventADMMConfig(delta=delta, trigger="relative"))
        out = relative.finish(ctx, w(0.3, 0.4), w(0.5, 1.0), w(4.0, 5.0), {})
        assert (out.uplink is not None) == fires
        assert out.info["trigger_norm"] == pytest.approx(2.5) and out.info["trigger_unit/relative"] == 5.0
        assert "z_step" not in out.state
    # progress: unit N * 0.5 = 2.5; the step is remembered in the state for the fade
    progress = EventADMM(EventADMMConfig(delta=1.0, trigger="progress"))
    out = progress.finish(ctx, w(0.3, 0.4), w(0.5, 1.0), w(4.0, 5.0), {})
    assert out.uplink is not None and float(out.state["z_step"]) == pytest.approx(0.5)
    assert out.state["z_step"].dtype == torch.float64


def test_thresholds_decay_resets_and_the_default_downlink_threshold():
    config = EventADMMConfig(delta=8.0, delta_decay=0.5, reset_every=3)
    assert config.threshold(8.0, 1) == 8.0 and config.threshold(8.0, 4) == 1.0  # Delta decay^(k-1)
    assert [config.is_reset(k) for k in (1, 2, 3, 4, 6)] == [False, False, True, False, True]
    assert not EventADMMConfig().is_reset(3)
    assert config.delta_z == pytest.approx(0.08) and EventADMMConfig(delta=8.0, delta_z=1.0).delta_z == 1.0
    # a reset round makes every agent send, however small its change
    quiet = EventADMM(EventADMMConfig(delta=1e6, reset_every=3))
    assert quiet.finish(ctx_for({}, None, round=3), w(0.0), w(0.0), w(1.0), {}).uplink is not None
    assert quiet.finish(ctx_for({}, None, round=4), w(0.0), w(0.0), w(1.0), {}).uplink is None


def test_after_a_reset_round_the_server_remembers_the_z_it_broadcast():
    from taciturn.algorithms.base import Arrival

    algorithm = EventADMM(EventADMMConfig(delta=1.0, delta_z=1e6, reset_every=2))
    state = algorithm.init_server(w(0.0, 0.0), 2)
    state.z, state.z_sent = w(1.0, 1.0), w(0.0, 0.0)  # z moved since the last broadcast
    v = Message({"w": np.array([2.0, 2.0])})
    after_reset = algorithm.aggregate(state, 2, [Arrival(0, v)])  # round 2 opened with z = (1, 1) to all
    assert not after_reset.broadcast and torch.equal(after_reset.z_sent["w"], state.z["w"])
    plain = algorithm.aggregate(state, 3, [Arrival(0, v)])
    assert torch.equal(plain.z_sent["w"], state.z_sent["w"])
    torch.testing.assert_close(plain.z["w"], torch.tensor([1.0, 1.0], dtype=torch.float64))  # (2 + 0) / 2
    assert torch.equal(state.copies["w"], torch.zeros(2, 2, dtype=torch.float64))  # the old table is kept


def test_an_agent_that_never_heard_z_stays_silent_and_momentum_can_be_dropped():
    algorithm = EventADMM(EventADMMConfig(local={"momentum": 0.9}, persistent_momentum=False))
    assert algorithm.config.local.optimizer_state == "reset"  # persistent_momentum is that key
    assert algorithm.client_begin(ctx_for({}, None)).uplink is None
    work = algorithm.client_begin(ctx_for({}, Message({"w": np.array([2.0])})))  # first z: u = 0
    assert torch.equal(work.consts["u"]["w"], torch.zeros(1, dtype=torch.float64))
    assert work.optimizer_state is None
    out = algorithm.finish(ctx_for({}, None), w(0.0), w(0.0), w(1.0), {})
    assert sorted(out.state) == ["last/w", "u/w", "x_hat/w", "z_hat/w"]
    assert EventADMM(EventADMMConfig()).config.local.optimizer_state == "keep"  # the authors' default
    with pytest.raises(ValueError, match="contradicts"):
        EventADMMConfig(persistent_momentum=True, local={"optimizer_state": "reset"})


def sgd_x_update_by_hand(a, b, start, anchor, rho, steps, lr, beta, buf):
    """Full-batch heavy-ball SGD on (1/2n)||A x - b||^2 + (rho/2)||x - anchor||^2 from ``start`` with
    the momentum buffer ``buf`` (engine/local_training.py: b <- beta b + g; x <- x - lr b):
    (the end point, the buffer, the mean objective over the steps)."""
    x, buf, values = start.clone(), buf.clone(), []
    for _ in range(steps):
        values.append(float(0.5 * ((a @ x - b) ** 2).mean() + 0.5 * rho * ((x - anchor) ** 2).sum()))
        g = a.T @ (a @ x - b) / len(b) + rho * (x - anchor)
        buf = beta * buf + g
        x = x - lr * buf
    return x, buf, sum(values) / steps


def test_sgd_x_updates_with_persistent_momentum_two_rounds_by_hand():
    """Two agents (20 and 40 samples), rho_i = rho (n / N) / n_i, 3 full-batch steps with momentum
    0.5 kept across rounds: z, each agent's dual, relaxed model, last vector and momentum buffer,
    and the mean local objective each uplink reports, for two rounds."""
    data = least_squares_data(num_clients=2)
    steps, lr, beta, rho = 3, 0.05, 0.5, 2.0
    algorithm = EventADMM(
        EventADMMConfig(rho=rho, local={"steps": steps, "batch_size": 10_000, "lr": lr, "momentum": beta})
    )
    fed = federation(algorithm, data)
    heard = {}
    original = algorithm.aggregate

    def spy(state, round, arrivals):
        heard[round] = {a.client: dict(a.message.meta) for a in arrivals}
        return original(state, round, arrivals)

    algorithm.aggregate = spy
    batches = [data.batch(data.client_indices(i)) for i in range(2)]
    rhos = [rho * 30 / 20, rho * 30 / 40]
    zero = torch.zeros(3, dtype=torch.float64)
    z, u, x, bufs = zero, [zero, zero], [zero, zero], [zero, zero]
    state = start(algorithm, data)
    for round in (1, 2):
        if round == 2:  # u_i <- u_i + x_hat_i - z
            u = [u[i] + x[i] - z for i in range(2)]
        paths = [
            sgd_x_update_by_hand(*batches[i], z, z - u[i], rhos[i], steps, lr, beta, bufs[i])
            for i in range(2)
        ]
        x, bufs = [p[0] for p in paths], [p[1] for p in paths]
        v = [x[i] + u[i] for i in range(2)]
        z = (v[0] + v[1]) / 2
        state, report = fed.run_round(state, round)
        assert report.accepted == [0, 1]
        torch.testing.assert_close(state.z["w"], z, rtol=1e-12, atol=1e-12)
        for i in range(2):
            held = fed.executor.pipeline.store.get(i)
            for key, expected in (
                ("u", u[i]),
                ("x_hat", x[i]),
                ("last", v[i]),
                ("optimizer/momentum_buffer", bufs[i]),
            ):
                torch.testing.assert_close(held[f"{key}/w"], expected, rtol=1e-12, atol=1e-12, msg=key)
            assert heard[round][i]["train_loss"] == pytest.approx(paths[i][2], rel=1e-12)


def test_over_relaxation_by_hand():
    """x_hat = alpha x + (1 - alpha) z_hat: alpha = 1.5, x = (2, 4), z_hat = (1, 0), u = (0.5, 0)."""
    algorithm = EventADMM(EventADMMConfig(relaxation=1.5))
    out = algorithm.finish(ctx_for({}, None), w(1.0, 0.0), w(0.5, 0.0), w(2.0, 4.0), {})
    assert out.state["x_hat/w"].tolist() == [2.5, 6.0]  # 1.5 (2, 4) - 0.5 (1, 0)
    assert out.state["u/w"].tolist() == [0.5, 0.0] and out.state["z_hat/w"].tolist() == [1.0, 0.0]
    assert out.uplink.arrays["w"].tolist() == [3.0, 6.0] and out.state["last/w"].tolist() == [3.0, 6.0]
    assert sorted(out.state) == ["last/w", "u/w", "x_hat/w", "z_hat/w"]


def test_the_lucky_agents_are_floor_c_n_drawn_from_the_servers_stream_of_the_round():
    from taciturn.core.rng import SERVER

    algorithm = EventADMM(EventADMMConfig(lucky_fraction=0.29))
    algorithm.use_streams(Streams(0))
    state = algorithm.init_server({"w": torch.zeros(2)}, 100)
    state.broadcast = False
    clients = list(range(100))
    assert len(algorithm.downlink(state, 2, clients)) == 29  # 0.29 * 100 = 28.999999999999996
    algorithm.config.__dict__["lucky_fraction"] = 0.3
    for round in (2, 3):
        drawn = Streams(0).numpy(round, SERVER, "lucky").choice(clients, size=30, replace=False)
        assert list(algorithm.downlink(state, round, clients)) == drawn.tolist()

"""Event-based ADMM's rules beyond the paper (event_admm.py): triggers among sampled agents, a common
start that sends nothing in round 1, a per-agent downlink trigger, and changes on the uplink. Exact
cases worked by hand (who speaks, who hears, the bytes), equivalence with the paper's rules where
they must agree, and convergence on least squares."""

import json

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from taciturn.algorithms.base import Arrival
from taciturn.algorithms.event_admm import EventADMM, EventADMMConfig
from taciturn.core import SERVER, Direction, Message, Streams
from tests.quadratic import ExactXUpdate, federation, least_squares_data, optimum, run, start


def vec(*values):
    return torch.tensor(values, dtype=torch.float64)


def per_client(**config):
    algorithm = EventADMM(EventADMMConfig(downlink="per_client", **config))
    algorithm.use_streams(Streams(0))
    return algorithm


def state_with(algorithm, z, held, sent):
    state = algorithm.init_server({"w": torch.zeros(2, dtype=torch.float64)}, len(held))
    state.z = {"w": vec(*z)}
    state.held = {"w": torch.stack([vec(*h) for h in held])}
    state.sent = torch.tensor(sent)
    return state


# z = (0.3, 0.4); agent 0 holds z (gap 0), 1 holds 0 (gap 0.5), 2 holds (0.3, 0.3) (gap 0.1), 3 none yet
HELD = [(0.3, 0.4), (0.0, 0.0), (0.3, 0.3), (0.0, 0.0)]
SENT = [True, True, True, False]


@pytest.mark.parametrize(
    ("delta_z", "sampled", "recipients"),
    [
        (0.1, [0, 1, 2, 3], [1, 2, 3]),  # 0.5 >= 0.1, 0.1 >= 0.1 (float64: exactly 0.1 apart), never sent
        (0.1 + 1e-9, [0, 1, 2, 3], [1, 3]),
        (0.1, [0, 2], [2]),  # only sampled agents are sent anything
        (0.0, [0, 1, 2, 3], [1, 2, 3]),  # Delta_z = 0: every agent whose z is stale, never an unchanged z
    ],
)
def test_per_agent_downlink_trigger_by_hand(delta_z, sampled, recipients):
    algorithm = per_client(delta=1.0, delta_z=delta_z)
    state = state_with(algorithm, (0.3, 0.4), HELD, SENT)
    sent = algorithm.downlink(state, 5, sampled)
    assert sorted(sent) == recipients
    assert all(m.arrays["w"].tolist() == [0.3, 0.4] for m in sent.values())
    after = algorithm.aggregate(state, 5, [])  # z_sent_i <- z for the recipients, counted as held once sent
    for c in range(4):
        expected = [0.3, 0.4] if c in recipients else list(HELD[c])
        assert after.held["w"][c].tolist() == pytest.approx(expected)
        assert bool(after.sent[c]) == (SENT[c] or c in recipients)


def test_lucky_agents_are_drawn_among_the_sampled_agents_the_trigger_skipped():
    algorithm = per_client(delta=1.0, delta_z=1.0, lucky_fraction=0.5)
    state = state_with(algorithm, (0.3, 0.4), HELD, SENT)
    sent = algorithm.downlink(state, 5, [0, 1, 2, 3])
    skipped = [0, 1, 2]  # only agent 3 (never sent) needs z at Delta_z = 1
    lucky = Streams(0).numpy(5, SERVER, "lucky").choice(skipped, size=2, replace=False)  # floor(0.5 * 4)
    assert sorted(sent) == sorted([3, *lucky.tolist()])


def test_a_reset_round_sends_z_to_every_sampled_agent():
    algorithm = per_client(delta=1.0, delta_z=1.0, reset_every=5)
    state = state_with(algorithm, (0.3, 0.4), HELD, SENT)
    assert sorted(algorithm.downlink(state, 5, [0, 2])) == [0, 2]
    assert sorted(algorithm.downlink(state, 6, [0, 2])) == []


class Scripted(EventADMM):
    """x_i is what the test says; u, z_hat and last follow event-based ADMM."""

    def __init__(self, config):
        super().__init__(config)
        self.xs, self.seen = {}, {}

    def x_update(self, ctx, z_hat, u):
        self.seen[(ctx.round, ctx.client)] = z_hat["w"].tolist()
        return self.finish(ctx, z_hat, u, {"w": vec(*self.xs[(ctx.round, ctx.client)])}, {})


def safetensors_size(header: dict, payload: int) -> int:
    text = json.dumps(header, separators=(",", ":"))
    return 8 + -(-len(text) // 8) * 8 + payload


# one float64 vector of 2 values and no metadata: what one v_i or one z costs
VECTOR_BYTES = safetensors_size(
    {"__metadata__": {"taciturn": "{}"}, "w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}}, 16
)


def sampled(round, n=4, m=2):
    """McMahan et al.'s draw, as Algorithm.select_clients makes it from the server's stream."""
    return sorted(Streams(0).numpy(round, SERVER, "select").choice(n, size=m, replace=False).tolist())


def test_sampling_and_triggers_together_by_hand():
    """Round 1, common start: nothing goes down; the two sampled agents compute from z^0 = 0 and
    only the one whose x_i + u_i moved by Delta = 1 speaks. Round 2: z = v_a / 4 is 0.25 from what
    everyone holds, over Delta_z = 0.1, so the two agents sampled then are sent z."""
    data = least_squares_data(num_clients=4, dim=2)
    algorithm = Scripted(
        EventADMMConfig(fraction=0.5, delta=1.0, delta_z=0.1, start="common", downlink="per_client")
    )
    first, second = sampled(1), sampled(2)
    a, b = first
    algorithm.xs = {(1, a): (0.6, 0.8), (1, b): (0.3, 0.4)}  # ||v - last|| = 1.0 (speaks) and 0.5
    algorithm.xs |= {(2, c): (0.0, 0.0) for c in second}
    fed = federation(algorithm, data)
    state = start(algorithm, data)
    state, report = fed.run_round(state, 1)
    ledger = fed.executor.pipeline.channel.ledger
    assert report.selected == first and report.accepted == [a]
    assert ledger.round_totals(1, Direction.DOWN).messages_sent == 0  # everyone holds z^0 already
    assert algorithm.seen[(1, a)] == algorithm.seen[(1, b)] == [0.0, 0.0]
    assert ledger.round_totals(1, Direction.UP).bytes_sent == VECTOR_BYTES == 112  # 8 + 88 + 16
    assert state.z["w"].tolist() == pytest.approx([0.15, 0.2])  # (1/N) sum_i s_i, stale s_i = z^0
    state, report = fed.run_round(state, 2)
    assert report.selected == second
    assert [r["client"] for r in ledger.rows([2]) if r["direction"] == "down"] == second
    assert ledger.round_totals(2, Direction.DOWN).bytes_sent == 2 * VECTOR_BYTES
    assert all(algorithm.seen[(2, c)] == pytest.approx([0.15, 0.2]) for c in second)


class ExactEventADMM(ExactXUpdate, EventADMM):
    pass


def exact_run(data, rounds: int, drop: float = 0.0, **config):
    """Event-ADMM with exact x-updates (rho = 2, Delta = 0.05 unless config says otherwise) for
    `rounds` rounds over a channel that drops `drop` of each link: its ledger and last state."""
    algorithm = ExactEventADMM(EventADMMConfig(**({"rho": 2.0, "delta": 0.05} | config)))
    fed = federation(algorithm, data, drop_up=drop, drop_down=drop)
    return fed.executor.pipeline.channel.ledger, run(fed, start(algorithm, data), rounds)


def test_a_common_start_saves_the_round_one_broadcast_and_nothing_else_changes():
    data = least_squares_data()
    common, z_common = exact_run(data, 20, delta_z=0.01, start="common")
    broadcast, z_broadcast = exact_run(data, 20, delta_z=0.01, start="broadcast")
    assert broadcast.round_totals(1, Direction.DOWN).messages_sent == 5
    assert common.round_totals(1, Direction.DOWN).messages_sent == 0
    assert common.rows(range(1, 21)) == [
        r for r in broadcast.rows(range(1, 21)) if (r["round"], r["direction"]) != (1, "down")
    ]
    assert torch.equal(z_common.z["w"], z_broadcast.z["w"])  # z^0 held either way: the same run


def test_with_everyone_sampled_the_per_agent_trigger_sends_what_the_broadcast_sends():
    data = least_squares_data()
    paper, z_paper = exact_run(data, 40, delta_z=0.02, downlink="broadcast")
    ours, z_ours = exact_run(data, 40, delta_z=0.02, downlink="per_client")
    assert ours.rows() == paper.rows() and torch.equal(z_ours.z["w"], z_paper.z["w"])
    downs = sum(r["messages_sent"] for r in paper.rows() if r["direction"] == "down")
    assert 5 < downs < 5 * 40  # the trigger did stay silent in some rounds


def test_changes_on_the_uplink_are_the_same_algorithm_as_full_vectors():
    data = least_squares_data()
    ledger_full, full = exact_run(data, 40, drop=0.2, delta_z=0.01, uplink="full")
    ledger_change, change = exact_run(data, 40, drop=0.2, delta_z=0.01, uplink="change")
    assert ledger_change.rows() == ledger_full.rows()  # the same messages, the same bytes (both dense)
    torch.testing.assert_close(change.z["w"], full.z["w"], rtol=0, atol=1e-12)
    torch.testing.assert_close(change.copies["w"], full.copies["w"], rtol=0, atol=1e-12)


def test_the_server_adds_a_change_to_its_copy():
    algorithm = EventADMM(EventADMMConfig(uplink="change"))
    state = algorithm.init_server({"w": torch.ones(2, dtype=torch.float64)}, 2)
    after = algorithm.aggregate(state, 1, [Arrival(1, Message({"w": np.array([0.5, -1.0])}))])
    assert after.copies["w"].tolist() == [[1.0, 1.0], [1.5, 0.0]]  # s_1 = z^0 + r_1
    assert after.z["w"].tolist() == [1.25, 0.5]


def test_sampling_takes_the_per_agent_downlink_and_refuses_the_papers_broadcast():
    with pytest.raises(ValidationError, match="downlink = 'per_client'"):
        EventADMMConfig(fraction=0.5, delta=1.0, downlink="broadcast")
    assert EventADMMConfig(fraction=0.5, delta=1.0).downlink == "per_client"  # auto
    assert EventADMMConfig(delta=1.0).downlink == "broadcast"  # auto, everyone computes: the paper
    EventADMMConfig(fraction=0.5, delta=1.0, delta_z=0.0, downlink="broadcast")  # all sampled hear z


def test_sampled_triggered_agents_reach_the_consensus_optimum_with_a_decreasing_delta():
    data = least_squares_data()
    config = EventADMMConfig(
        rho=2.0,
        fraction=0.6,
        delta=0.01,
        delta_z=0.001,
        delta_decay=0.97,
        downlink="per_client",
        start="common",
    )
    algorithm = ExactEventADMM(config)
    fed = federation(algorithm, data)
    state = run(fed, start(algorithm, data), 300)
    assert float(torch.linalg.norm(state.z["w"] - optimum(data))) < 1e-5
    ledger = fed.executor.pipeline.channel.ledger
    computed = 3 * 300  # 3 of 5 agents a round
    assert ledger.totals(Direction.UP).messages_sent < computed / 2  # the trigger kept most of them silent
    assert ledger.totals(Direction.DOWN).messages_sent < computed

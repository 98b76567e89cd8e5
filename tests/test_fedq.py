"""FedQ-Hoeffding / FedQ-Bernstein: the trigger, both aggregation cases, the messages, exact regret."""

import math

import numpy as np
import pytest

from taciturn.core import Channel, Ledger, Message, Streams, codec
from taciturn.core.ledger import Direction
from taciturn.rl import FedQ, FedQFederation, UCBQLearning, bonuses, random_mdp, step_sizes, ucb
from taciturn.rl.agents import explore, trigger_thresholds
from taciturn.rl.federation import RoundRecord
from taciturn.rl.fedq import Aggregation
from taciturn.rl.mdp import TabularMDP
from taciturn.rl.step_sizes import alpha
from tests.test_rl_mdp import hand_mdp


def federation(mdp, agents, bonus="hoeffding", seed=0, **drops):
    fedq = FedQ(mdp.horizon, mdp.states, mdp.actions, agents, bonus)
    streams = Streams(seed)
    return fedq, FedQFederation(mdp, fedq, Channel(Ledger(), streams, **drops), streams)


def test_the_trigger_fires_at_the_stated_count():
    """One state, one action: every episode visits every (h, x), so a round lasts exactly c^k episodes,
    c^k = max{1, floor(N^k / (M H (H + 1)))}, and adds M c^k visits to every triple."""
    H, M = 2, 3
    mdp = TabularMDP(np.ones((H, 1, 1, 1)), np.full((H, 1, 1), 0.5), np.ones(1))
    fedq, fed = federation(mdp, M)
    state, N = fedq.init(), 0
    lengths = []
    for k in range(1, 40):
        state, record = fed.run_round(state, k, max_episodes=10**6)
        lengths.append(record.episodes)
        assert record.triggered
        assert record.episodes == max(1, N // (M * H * (H + 1)))
        N += M * record.episodes
        assert (state.visits == N).all()
    # by hand: N = 0, 3, ..., 33 give c = 1 (12 rounds); then 36 -> 2, 42 -> 2, 48 -> 2, 54 -> 3, 63 -> 3, ...
    assert lengths[:18] == [1] * 12 + [2, 2, 2, 3, 3, 4]


def reference_explore(mdp, policy, value, thresholds, rngs, max_episodes):
    """Agents and episodes one by one, the count checked after every episode (the paper's loop)."""
    M, H, S = len(rngs), mdp.horizon, mdp.states
    counts, sums, squares = np.zeros((M, H, S), int), np.zeros((M, H, S)), np.zeros((M, H, S))
    first = np.zeros((M, S), int)
    fired = np.zeros(M, bool)
    episodes = 0
    while episodes < max_episodes and not fired.any():
        episodes += 1
        for m, g in enumerate(rngs):
            u = g.random(H + 1)
            x = int(mdp.first_states(np.asarray(u[0])))
            first[m, x] += 1
            for h in range(H):
                y = int(mdp.next_states(h, x, policy[h, x], np.asarray(u[h + 1])))
                v = value[h + 1, y] if h + 1 < H else 0.0
                counts[m, h, x] += 1
                sums[m, h, x] += v
                squares[m, h, x] += v * v
                x = y
            fired[m] = (counts[m] >= thresholds).any()
    return episodes, counts, sums, squares, first, fired


@pytest.mark.parametrize("max_episodes", [10**6, 7])
def test_vectorised_exploration_equals_the_episode_by_episode_loop(max_episodes):
    mdp = random_mdp(3, 2, 4, np.random.default_rng(3))
    gen = np.random.default_rng(4)
    policy, value = gen.integers(0, 2, (4, 3)), gen.random((4, 3)) * 4
    thresholds = gen.integers(5, 40, (4, 3))
    agents = [Streams(9).numpy(1, m, "episodes") for m in range(5)]
    twins = [Streams(9).numpy(1, m, "episodes") for m in range(5)]
    got = explore(mdp, policy, value, thresholds, agents, max_episodes)
    episodes, counts, sums, squares, first, fired = reference_explore(
        mdp, policy, value, thresholds, twins, max_episodes
    )
    assert got.episodes == episodes and (max_episodes == 7) == (episodes == 7)
    assert np.array_equal(got.counts, counts) and np.array_equal(got.first_states, first)
    assert np.array_equal(got.fired, fired)
    np.testing.assert_allclose(got.next_value_sums, sums, rtol=1e-12)
    np.testing.assert_allclose(got.next_value_square_sums, squares, rtol=1e-12)


def test_trigger_thresholds():
    counts = np.array([[0, 11, 12], [23, 24, 1000]])
    assert trigger_thresholds(counts, agents=2, horizon=2).tolist() == [[1, 1, 1], [1, 2, 83]]


def test_single_agent_fedq_in_its_early_phase_is_ucb_hoeffding():
    """M = 1, N < i0: each round is one episode and case 1 is Jin et al.'s update, sample for sample."""
    mdp = random_mdp(2, 2, 3, np.random.default_rng(1))
    fedq, fed = federation(mdp, agents=1, seed=5)
    ucb = UCBQLearning(mdp, paths=1)
    state = fedq.init()
    for k in range(1, 21):  # 20 episodes: every count stays below i0 = 2 M H (H + 1) = 24
        state, record = fed.run_round(state, k, max_episodes=100)
        assert record.episodes == 1 and record.case2 == 0
        ucb.episode(Streams(5).numpy(k, 0, "episodes").random((1, mdp.horizon + 1)))
        np.testing.assert_allclose(state.q, ucb.q[0], rtol=1e-12)
        assert np.array_equal(state.visits, ucb.visits[0])
        assert np.array_equal(fedq.policy(state), ucb.policy[0])


def uploads(fedq, entries):
    """Upload messages with the given (agent, count, mean next value) at (h, x) = (0, 0)."""
    H, S = fedq.horizon, fedq.states
    out = {}
    for agent, count, v in entries:
        counts, sums = np.zeros((H, S), dtype=np.int64), np.zeros((H, S))
        counts[0, 0], sums[0, 0] = count, count * v
        out[agent] = fedq.upload(np.full((H, S), 0.4), counts, sums, sums * v)
    return out


def theta_weight(i, t, H):
    return alpha(i, H) * np.prod([1 - alpha(j, H) for j in range(i + 1, t + 1)])


def test_case_1_applies_the_samples_one_by_one_in_agent_order():
    fedq = FedQ(horizon=3, states=2, actions=2, agents=4)
    state = fedq.init()
    state.visits[0, 0, 0], state.q[0, 0] = 5, (2.5, 0.0)  # 5 < i0 = 96: case 1; pi_1(0) = 0
    new, aggregation = fedq.aggregate(state, uploads(fedq, [(3, 1, 2.5), (0, 1, 0.5), (1, 1, 1.5)]))
    q = 2.5
    for t, v in zip((6, 7, 8), (0.5, 1.5, 2.5), strict=True):  # agents 0, 1, 3
        q = (1 - alpha(t, 3)) * q + alpha(t, 3) * (0.4 + v + math.sqrt(3**3 / t))
    assert new.q[0, 0, 0] == pytest.approx(q, rel=1e-12)
    assert new.visits[0, 0, 0] == 8 and (aggregation.case1, aggregation.case2) == (1, 0)
    untouched = np.ones_like(state.q, dtype=bool)
    untouched[0, 0, 0] = False
    assert np.array_equal(new.q[untouched], state.q[untouched]) and state.visits[0, 0, 0] == 5


def test_case_2_is_equal_weight_aggregation():
    H = 2
    fedq = FedQ(horizon=H, states=2, actions=2, agents=3)
    state = fedq.init()
    t0 = fedq.case_threshold  # i0 = 2 * 3 * 2 * 3 = 36: case 2
    state.visits[0, 0, 0], state.q[0, 0] = t0, (1.7, 0.0)
    new, aggregation = fedq.aggregate(state, uploads(fedq, [(0, 2, 1.0), (2, 3, 2.0)]))
    t1 = t0 + 5
    keep = np.prod([1 - alpha(t, H) for t in range(t0 + 1, t1 + 1)])
    v_bar = (2 * 1.0 + 3 * 2.0) / 5
    half_beta = sum(theta_weight(t, t1, H) * math.sqrt(H**3 / t) for t in range(t0 + 1, t1 + 1))
    expected = keep * 1.7 + (1 - keep) * (0.4 + v_bar) + half_beta
    assert new.q[0, 0, 0] == pytest.approx(expected, rel=1e-12)
    assert new.visits[0, 0, 0] == t1 and (aggregation.case1, aggregation.case2) == (0, 1)


def test_bernstein_uses_the_variance_of_all_next_values_so_far():
    H, S, A, M = 2, 2, 2, 3
    fedq = FedQ(H, S, A, M, bonus="bernstein")
    state = fedq.init()
    t0 = 40  # case 2; earlier samples: 40 next values with mean 1 and mean square 1.5
    state.visits[0, 0, 0], state.q[0, 0] = t0, (1.2, 0.0)
    state.value_sum[0, 0, 0], state.square_sum[0, 0, 0], state.beta[0, 0, 0] = 40.0, 60.0, 0.9
    new, _ = fedq.aggregate(state, uploads(fedq, [(0, 2, 1.0), (1, 4, 2.0)]))  # mean squares v^2
    t1 = 46
    mean, mean_square = (40 + 2 * 1.0 + 4 * 2.0) / t1, (60 + 2 * 1.0 + 4 * 4.0) / t1
    burn_in = np.sqrt(H**7 * S * A) + np.sqrt(M * S * A * H**6)
    beta = min(np.sqrt(H * (mean_square - mean**2 + H) / t1) + burn_in / t1, np.sqrt(H**3 / t1))
    keep = np.prod([1 - alpha(t, H) for t in range(t0 + 1, t1 + 1)])
    expected = keep * 1.2 + (1 - keep) * (0.4 + (2 * 1.0 + 4 * 2.0) / 6) + (beta - keep * 0.9) / 2
    assert new.q[0, 0, 0] == pytest.approx(expected, rel=1e-12)
    assert new.beta[0, 0, 0] == pytest.approx(beta) and new.value_sum[0, 0, 0] == pytest.approx(50.0)


class Spy:
    """Wraps a channel to keep every message it carries."""

    def __init__(self, channel):
        self.channel, self.sent = channel, []

    def send(self, direction, round, client, message):
        self.sent.append((direction, round, client, message))
        return self.channel.send(direction, round, client, message)


@pytest.mark.parametrize(("bonus", "per_scalar"), [("hoeffding", 3), ("bernstein", 4)])
def test_each_round_sends_3SH_down_and_3SH_or_4SH_up_per_agent_and_the_ledger_counts_the_bytes(
    bonus, per_scalar
):
    H, S, M = 4, 3, 5
    mdp = random_mdp(S, 2, H, np.random.default_rng(2))
    fedq, fed = federation(mdp, M, bonus)
    fed.channel, fed.control = Spy(fed.channel), Spy(fed.control)
    state = fedq.init()
    for k in range(1, 31):
        state, record = fed.run_round(state, k, max_episodes=10**6)
        assert record.scalars_up == M * per_scalar * S * H and record.scalars_down == M * 3 * S * H
    data = [s for s in fed.channel.sent if s[3].arrays]
    for direction, _, _, message in data:
        assert (
            sum(a.size for a in message.arrays.values())
            == (3 if direction == Direction.DOWN else per_scalar) * S * H
        )
        assert all(a.shape == (H, S) for a in message.arrays.values())
    assert {name for d, _, _, m in data if d == Direction.UP for name in m.arrays} == set(
        ["reward", "count", "next_value", "next_value_sq"][:per_scalar]
    )
    sent = fed.channel.sent + fed.control.sent
    for row in fed.channel.channel.ledger.rows():
        mine = [
            m for d, r, c, m in sent if (r, c, d.value) == (row["round"], row["client"], row["direction"])
        ]
        assert row["bytes_sent"] == sum(len(codec.encode(m)) for m in mine)
        assert row["messages_sent"] == len(mine)  # data + trigger or stop


def test_the_first_rounds_regret_is_exact():
    """pi^1 plays action 0: from state 0 that is worth 0.6 against V*_1(0) = 1.1 (see hand_mdp)."""
    mdp = hand_mdp(initial=(1.0, 0.0))
    fedq, fed = federation(mdp, agents=4)
    _, record = fed.run_round(fedq.init(), 1, max_episodes=10)
    assert record.episodes == 1 and record.regret == pytest.approx(4 * 0.5)
    assert record.policy_gap == pytest.approx(0.5)


def test_lost_messages_hit_only_what_they_carry():
    mdp = random_mdp(3, 2, 3, np.random.default_rng(0))
    fedq, fed = federation(mdp, agents=4, drop_up=1.0)
    state, record = fed.run_round(fedq.init(), 1, max_episodes=10)
    assert record.uploads_lost == 4 and record.regret > 0  # played, counted, never aggregated
    assert np.array_equal(state.q, fedq.init().q) and (state.visits == 0).all()
    fedq, fed = federation(mdp, agents=4, drop_down=0.5, seed=1)
    explorers = [fed.run_round(fedq.init(), k, max_episodes=10)[1].exploring for k in range(1, 30)]
    # exactly the agents whose broadcast survived its own seeded drop (core/channel.py) explore
    streams = Streams(1)
    heard = [sum(streams.numpy(k, m, "drop-down").random() >= 0.5 for m in range(4)) for k in range(1, 30)]
    assert explorers == heard and 0 in explorers and 4 in explorers  # some rounds nobody, some everyone


def test_the_federation_refuses_a_mismatched_mdp():
    fedq = FedQ(2, 2, 2, 1)
    with pytest.raises(ValueError, match="MDP has"):
        FedQFederation(
            random_mdp(3, 2, 2, np.random.default_rng(0)), fedq, Channel(Ledger(), Streams(0)), Streams(0)
        )


def test_messages_are_plain_arrays():
    fedq = FedQ(2, 2, 2, 1)
    message = fedq.broadcast(fedq.init())
    assert isinstance(message, Message) and set(message.arrays) == {"policy", "count", "value"}
    assert (message.arrays["value"] == 2.0).all() and (message.arrays["policy"] == 0).all()


def test_ucb_paths_do_not_depend_on_their_batch_and_regret_is_exact():
    mdp = hand_mdp(initial=(1.0, 0.0))
    alone = ucb.run(UCBQLearning(mdp, 1), 300, [Streams(4)], np.array([1, 300]))
    pair = ucb.run(UCBQLearning(mdp, 2), 300, [Streams(3), Streams(4)], np.array([1, 300]))
    assert np.array_equal(pair[1], alone[0])
    assert alone[0, 0] == pytest.approx(0.5)  # the first episode plays action 0: V*_1(0) - V^pi_1(0) = 0.5


def test_ucb_bernstein_first_visit_adds_half_the_capped_bonus():
    mdp = hand_mdp(initial=(1.0, 0.0))
    learner = UCBQLearning(mdp, 1, "bernstein")
    states, _ = learner.episode(np.array([[0.3, 0.3, 0.3]]))
    # step 2 from state 0 with action 0: alpha_1 = 1, Q = r + V_3 + b_1, b_1 = beta_1 / 2 = sqrt(H^3) / 2
    assert learner.q[0, 1, states[0, 1], 0] == pytest.approx(mdp.rewards[1, states[0, 1], 0] + np.sqrt(8) / 2)


def test_bonus_and_step_size_formulas_by_hand():
    """Every constant of the bonuses and step sizes, written out here rather than called."""
    H, c, iota = 3, 2.0, 1.5
    assert bonuses.hoeffding(4, H, c, iota) == pytest.approx(2.0 * math.sqrt(27 * 1.5 / 4), rel=1e-14)

    def a(t):  # alpha_t = (H + 1) / (H + t)
        return 4 / (3 + t)

    assert alpha(5, H) == pytest.approx(4 / 8, rel=1e-14)
    # theta_7^5 = alpha_5 (1 - alpha_6)(1 - alpha_7); hoeffding_round(4, 7) sums theta_7^t b_t, t = 5..7
    theta_75 = a(5) * (1 - a(6)) * (1 - a(7))
    assert step_sizes.theta(5, 7, H) == pytest.approx(theta_75, rel=1e-14)
    weights = {t: a(t) * math.prod(1 - a(j) for j in range(t + 1, 8)) for t in (5, 6, 7)}
    by_hand = sum(w * c * math.sqrt(27 * iota / t) for t, w in weights.items())
    assert bonuses.hoeffding_round(np.array([4]), np.array([7]), H, c, iota)[0] == pytest.approx(
        by_hand, rel=1e-13
    )

    B = 0.5  # Bernstein: c min{sqrt(H iota (W + H) / t) + iota B / t, sqrt(H^3 iota / t)}, 0 at t = 0
    got = bonuses.bernstein(np.array([0, 4, 40]), np.array([1.0, 1.0, 200.0]), H, B, c, iota)
    assert got[0] == 0.0
    assert got[1] == pytest.approx(2.0 * (math.sqrt(3 * 1.5 * 4 / 4) + 1.5 * 0.5 / 4), rel=1e-14)
    assert got[2] == pytest.approx(2.0 * math.sqrt(27 * 1.5 / 40), rel=1e-14)  # the cap binds
    assert bonuses.jin_burn_in(2, 3, 4) == pytest.approx(math.sqrt(2**7 * 3 * 4), rel=1e-14)
    assert bonuses.fedq_burn_in(2, 3, 4, 5) == pytest.approx(
        math.sqrt(2**7 * 12) + math.sqrt(5 * 12 * 2**6), rel=1e-14
    )


def test_upload_and_broadcast_carry_exactly_these_arrays():
    fedq = FedQ(2, 2, 2, 3, "bernstein")
    count = np.array([[2, 0], [1, 4]])
    message = fedq.upload(
        np.array([[0.5, 0.7], [0.2, 0.1]]),  # r_h(x, pi_h(x))
        count,
        np.array([[3.0, 9.0], [1.0, 2.0]]),  # sums of next values
        np.array([[5.0, 9.0], [1.0, 4.0]]),  # sums of their squares
    )
    arrays = message.arrays
    assert arrays["reward"].tolist() == [[0.5, 0.0], [0.2, 0.1]]  # unvisited cells carry zeros
    assert arrays["count"].tolist() == [[2, 0], [1, 4]]
    assert arrays["next_value"].tolist() == [[1.5, 0.0], [1.0, 0.5]]
    assert arrays["next_value_sq"].tolist() == [[2.5, 0.0], [1.0, 1.0]]
    assert set(FedQ(2, 2, 2, 3).upload(arrays["reward"], count, count * 1.0, count * 1.0).arrays) == {
        "reward",
        "count",
        "next_value",
    }
    state = fedq.init()
    state.q[...] = [[[1.0, 3.0], [2.0, 2.0]], [[5.0, 0.0], [0.5, 0.7]]]
    state.visits[...] = [[[4, 7], [1, 2]], [[3, 0], [6, 8]]]
    down = fedq.broadcast(state).arrays
    assert down["policy"].dtype == np.int32 and down["policy"].tolist() == [[1, 0], [0, 1]]  # ties: first
    assert down["count"].tolist() == [[7, 1], [3, 8]]  # N under the policy
    assert down["value"].tolist() == [[2.0, 2.0], [2.0, 0.7]]  # min{H, max_a Q}


def test_case_1_refuses_two_samples_from_one_agent_and_bad_sizes_are_refused():
    fedq = FedQ(2, 2, 2, 3)
    with pytest.raises(AssertionError, match="at most one sample per agent"):
        fedq.aggregate(fedq.init(), uploads(fedq, [(0, 2, 1.0)]))  # N = 0 < i0: case 1
    with pytest.raises(ValueError, match="horizon, states, actions and agents must all be >= 1"):
        FedQ(2, 2, 2, 0)
    with pytest.raises(ValueError, match="bonus must be 'hoeffding' or 'bernstein', got 'ucb'"):
        FedQ(2, 2, 2, 1, "ucb")
    with pytest.raises(ValueError, match="bonus must be 'hoeffding' or 'bernstein', got 'ucb'"):
        UCBQLearning(random_mdp(2, 2, 2, np.random.default_rng(0)), bonus="ucb")
    with pytest.raises(ValueError, match="one Streams per path: got 1 for 2 paths"):
        ucb.run(
            UCBQLearning(random_mdp(2, 2, 2, np.random.default_rng(0)), 2), 3, [Streams(0)], np.array([3])
        )


def test_ucb_regret_is_the_gap_of_the_policy_held_at_each_episode_start():
    """Against a plain loop: the same uniforms (path 0's stream, agent 0, blocks of 4096 episodes),
    one episode at a time, V*_1 - V^pi_1 of the first state re-evaluated before every episode."""
    mdp = hand_mdp(initial=(0.6, 0.4))
    record_at = np.array([1, 7, 4096, 4100])
    got = ucb.run(UCBQLearning(mdp, 1), 4100, [Streams(8)], record_at)
    learner, regret, expected = UCBQLearning(mdp, 1), 0.0, []
    uniforms = np.concatenate(
        [
            Streams(8).numpy(0, 0, "episodes").random((4096, 3)),
            Streams(8).numpy(1, 0, "episodes").random((4, 3)),
        ]
    )
    for j, u in enumerate(uniforms, start=1):
        values = mdp.policy_values(learner.policy[0])
        states, _ = learner.episode(u[None])
        regret += mdp.optimal[1][0, states[0, 0]] - values[0, states[0, 0]]
        if j in record_at:
            expected.append(regret)
    np.testing.assert_allclose(got[0], expected, rtol=1e-12)


def test_a_round_nobody_hears_reports_the_servers_policy_gap():
    """Every broadcast lost: no episode, and the record states the server's policy gap. pi^1 plays
    action 0, worth 0.6 from state 0 against V*_1(0) = 1.1: 0.5 under mu = (1, 0) (see hand_mdp)."""
    mdp = hand_mdp(initial=(1.0, 0.0))
    fedq, fed = federation(mdp, agents=2, drop_down=1.0)
    state, record = fed.run_round(fedq.init(), 1, max_episodes=10)
    assert record.policy_gap == pytest.approx(0.5, rel=1e-12)
    nothing = dict(round=1, episodes=0, exploring=0, regret=0.0, triggered=False, scalars_up=0)
    nothing |= dict(uploads_lost=0, case1=0, case2=0, policy_changes=0, policy_gap=record.policy_gap)
    assert record == RoundRecord(**nothing, scalars_down=2 * 3 * 2 * 2)  # 2 agents, 3SH scalars each
    assert np.array_equal(state.q, fedq.init().q)


def test_bernstein_bonuses_where_the_variance_term_is_the_smaller():
    """t ~ 10^4 on a one-state, one-action MDP with H = 2: B / t is small, so beta is
    sqrt(H (W + H) / t) + B / t, below the cap sqrt(H^3 / t), and W is what decides it."""
    H, t0, t1 = 2, 9990, 10000
    burn_in = math.sqrt(2**7) + math.sqrt(2**6)  # FedQ: sqrt(H^7 S A) + sqrt(M S A H^6), S = A = M = 1
    fedq = FedQ(H, 1, 1, 1, bonus="bernstein")
    state = fedq.init()
    state.visits[0, 0, 0], state.q[0, 0, 0] = t0, 1.2
    state.value_sum[0, 0, 0], state.square_sum[0, 0, 0], state.beta[0, 0, 0] = t0 * 1.0, t0 * 1.5, 0.03
    new, _ = fedq.aggregate(state, uploads(fedq, [(0, 10, 1.4)]))  # ten next values of 1.4
    mean, mean_square = (t0 + 14.0) / t1, (t0 * 1.5 + 10 * 1.96) / t1
    variance_term = math.sqrt(H * (mean_square - mean**2 + H) / t1) + burn_in / t1
    assert variance_term < math.sqrt(H**3 / t1)
    keep = math.prod(1 - 3 / (2 + t) for t in range(t0 + 1, t1 + 1))  # 1 - alpha_t, alpha_t = 3 / (2 + t)
    expected = keep * 1.2 + (1 - keep) * (0.4 + 1.4) + (variance_term - keep * 0.03) / 2
    assert new.q[0, 0, 0] == pytest.approx(expected, rel=1e-12)
    assert new.beta[0, 0, 0] == pytest.approx(variance_term, rel=1e-12)
    assert new.square_sum[0, 0, 0] == pytest.approx(t0 * 1.5 + 19.6) and new.value_sum[
        0, 0, 0
    ] == pytest.approx(t0 + 14.0)

    # UCB-Bernstein (Jin et al.), B = sqrt(H^7 S A): the 10^4-th visit of (h = 1, x, a) with V_2 = 1.3
    mdp = TabularMDP(np.ones((H, 1, 1, 1)), np.full((H, 1, 1), 0.5), np.ones(1))
    learner = UCBQLearning(mdp, 1, "bernstein")
    cell = (0, 0, 0, 0)
    learner.visits[cell], learner.q[cell], learner.beta[cell] = t1 - 1, 1.7, 0.02
    learner.value_sum[cell], learner.square_sum[cell] = (t1 - 1) * 1.0, (t1 - 1) * 1.5
    learner.value[0, 1, 0] = 1.3
    learner.episode(np.full((1, H + 1), 0.5))
    mean, mean_square = ((t1 - 1) + 1.3) / t1, ((t1 - 1) * 1.5 + 1.69) / t1
    beta = math.sqrt(H * (mean_square - mean**2 + H) / t1) + math.sqrt(2**7) / t1
    assert beta < math.sqrt(H**3 / t1)
    step = 3 / (2 + t1)
    bonus = (beta - (1 - step) * 0.02) / (2 * step)
    assert learner.q[cell] == pytest.approx((1 - step) * 1.7 + step * (0.5 + 1.3 + bonus), rel=1e-12)
    assert learner.beta[cell] == pytest.approx(beta, rel=1e-12) and learner.visits[cell] == t1


def test_hoeffding_round_over_more_terms_than_one_batch():
    """A cell of 2^20 + 5 terms fills a batch alone; the next cell runs in a second batch.
    Reference: theta_{t1}^t = alpha_t prod_{j=t+1}^{t1} (1 - alpha_j) with 1 - alpha_j = (j - 1) / (H + j),
    the product as a reversed cumulative sum of logs, b_t = sqrt(H^3 / t) (c = iota = 1)."""
    H = 2

    def by_hand(t0, t1):
        t = np.arange(t0 + 1, t1 + 1, dtype=np.float64)
        log_keep = np.log(np.maximum(t - 1, 1) / (H + t))  # log(1 - alpha_t); t = 1's is never used
        after = np.concatenate([np.cumsum(log_keep[::-1])[::-1][1:], [0.0]])  # sum over j = t+1..t1
        return float(np.sum((H + 1) / (H + t) * np.exp(after) * np.sqrt(H**3 / t)))

    t0, t1 = np.array([0, 3]), np.array([2**20 + 5, 13])
    got = bonuses.hoeffding_round(t0, t1, H, 1.0, 1.0)
    np.testing.assert_allclose(got, [by_hand(0, 2**20 + 5), by_hand(3, 13)], rtol=1e-9)


def test_aggregation_counts_the_states_whose_greedy_action_changed():
    fedq = FedQ(horizon=2, states=2, actions=2, agents=3)
    state = fedq.init()
    assert fedq.aggregate(state, {}) == (state, Aggregation(0, 0, 0))  # nothing arrived
    state.q[0, 0] = (5.0, 4.9)  # pi_1(0) = 0; one sample sets Q = 0.4 + 0 + sqrt(8) = 3.23 < 4.9
    new, aggregation = fedq.aggregate(state, uploads(fedq, [(1, 1, 0.0)]))
    assert new.q[0, 0, 0] == pytest.approx(0.4 + math.sqrt(8), rel=1e-12)
    assert aggregation == Aggregation(case1=1, case2=0, policy_changes=1)
    assert fedq.policy(new)[0, 0] == 1 and state.q[0, 0, 0] == 5.0  # the old state is left alone

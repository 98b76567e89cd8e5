"""Tabular MDPs: exact values on a hand-built MDP, the random generator, sampling, step sizes, bonuses."""

import re

import numpy as np
import pytest

from taciturn.core import Message, codec
from taciturn.rl import bonuses
from taciturn.rl.mdp import TabularMDP, random_mdp
from taciturn.rl.step_sizes import alpha, alpha_c, theta


def hand_mdp(initial=(0.5, 0.5)) -> TabularMDP:
    """H = 2, S = 2, A = 2.

    Step 1: state 0: a0 pays 0.5 and stays in 0, a1 pays 0.2 and moves to 1;
            state 1: a0 pays 0 and moves to 0 or 1 with probability 1/2, a1 pays 1 and moves to 0.
    Step 2: rewards (0.1, 0.3) in state 0 and (0.9, 0.4) in state 1 (transitions do not matter).
    """
    P = np.zeros((2, 2, 2, 2))
    P[0, 0, 0] = [1, 0]
    P[0, 0, 1] = [0, 1]
    P[0, 1, 0] = [0.5, 0.5]
    P[0, 1, 1] = [1, 0]
    P[1] = 0.5
    r = np.array([[[0.5, 0.2], [0.0, 1.0]], [[0.1, 0.3], [0.9, 0.4]]])
    return TabularMDP(P, r, np.array(initial))


def test_optimal_values_by_hand():
    q, v = hand_mdp().optimal
    # V*_2 = (0.3, 0.9); Q*_1(0,.) = (0.5 + 0.3, 0.2 + 0.9); Q*_1(1,.) = (0.5 * 0.3 + 0.5 * 0.9, 1 + 0.3)
    np.testing.assert_allclose(v, [[1.1, 1.3], [0.3, 0.9], [0.0, 0.0]])
    np.testing.assert_allclose(q[0], [[0.8, 1.1], [0.6, 1.3]])
    np.testing.assert_allclose(q[1], [[0.1, 0.3], [0.9, 0.4]])


def test_policy_values_gaps_and_min_gap_by_hand():
    mdp = hand_mdp()
    always_0 = np.zeros((2, 2), dtype=int)
    np.testing.assert_allclose(mdp.policy_values(always_0), [[0.6, 0.5], [0.1, 0.9], [0, 0]])
    batch = np.stack([always_0, mdp.optimal[0].argmax(-1)])  # a batch of policies
    np.testing.assert_allclose(mdp.policy_values(batch)[1], mdp.optimal[1])
    np.testing.assert_allclose(mdp.gaps, [[[0.3, 0.0], [0.7, 0.0]], [[0.2, 0.0], [0.0, 0.5]]], atol=1e-15)
    assert mdp.min_gap() == pytest.approx(0.2)
    np.testing.assert_allclose(mdp.occupancy(always_0), [[0.5, 0.5], [0.75, 0.25]])


def test_rollout_follows_the_transitions():
    mdp = hand_mdp(initial=(1.0, 0.0))
    policy = np.array([[1, 1], [0, 0]])  # a1 at step 1: 0 -> 1 surely
    states = mdp.rollout(policy, np.random.default_rng(0).random((1000, 3)))
    assert (states[:, 0] == 0).all() and (states[:, 1] == 1).all()
    frequencies = np.bincount(states[:, 2], minlength=2) / 1000  # step 2 moves uniformly
    np.testing.assert_allclose(frequencies, [0.5, 0.5], atol=0.05)


def test_random_mdp_is_the_papers_generator_and_reproducible():
    mdp = random_mdp(4, 3, 5, np.random.default_rng(7))
    assert mdp.transitions.shape == (5, 4, 3, 4) and mdp.rewards.shape == (5, 4, 3)
    np.testing.assert_allclose(mdp.transitions.sum(-1), 1.0)
    np.testing.assert_allclose(mdp.initial, 0.25)
    again = random_mdp(4, 3, 5, np.random.default_rng(7))
    assert np.array_equal(mdp.transitions, again.transitions) and np.array_equal(mdp.rewards, again.rewards)
    back = TabularMDP.from_message(codec.decode(codec.encode(mdp.to_message())))
    assert np.array_equal(back.transitions, mdp.transitions) and np.array_equal(back.rewards, mdp.rewards)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda P, r, mu: (P * 2, r, mu), "probability vector"),
        (lambda P, r, mu: (P, r + 1.5, mu), "rewards must lie in [0, 1]"),
        (lambda P, r, mu: (P, r[:1], mu), "rewards must have shape"),
        (lambda P, r, mu: (P, r, np.array([1.0])), "initial must have shape"),
    ],
)
def test_malformed_mdps_are_refused_with_the_reason(change, message):
    mdp = hand_mdp()
    with pytest.raises(ValueError, match=re.escape(message)):
        TabularMDP(*change(mdp.transitions, mdp.rewards, mdp.initial))


def test_step_size_products_match_their_definitions():
    H = 3
    for t1, t2 in [(1, 1), (1, 5), (2, 2), (4, 9), (7, 40), (5, 4)]:
        product = np.prod([1 - alpha(t, H) for t in range(t1, t2 + 1)])  # empty product = 1
        assert alpha_c(t1, t2, H) == pytest.approx(product, rel=1e-12, abs=1e-300)
    for t in (1, 2, 5, 30):  # the weights theta_t^i of the t-th estimate sum to one
        assert sum(theta(i, t, H) for i in range(1, t + 1)) == pytest.approx(1.0, rel=1e-12)


def test_hoeffding_round_bonus_equals_the_recursion():
    """beta_t = (1 - alpha_t) beta_{t-1} + 2 alpha_t b_t; a round adds beta_{t1} - alpha^c beta_{t0}."""
    H, c, iota = 4, 0.7, 1.3
    beta = [0.0]
    for t in range(1, 400):
        beta.append((1 - alpha(t, H)) * beta[-1] + 2 * alpha(t, H) * bonuses.hoeffding(t, H, c, iota))
    t0 = np.array([0, 0, 5, 17, 100, 250])
    t1 = np.array([1, 9, 6, 60, 399, 399])
    expected = [(beta[b] - alpha_c(a + 1, b, H) * beta[a]) / 2 for a, b in zip(t0, t1, strict=True)]
    np.testing.assert_allclose(bonuses.hoeffding_round(t0, t1, H, c, iota), expected, rtol=1e-10)


def test_bernstein_bonus_is_the_smaller_of_its_two_forms():
    H, iota, burn_in = 3, 1.0, 10.0
    t, variance = np.array([0, 1, 50, 10**6]), np.array([0.0, 0.5, 0.5, 2.0])
    beta = bonuses.bernstein(t, variance, H, burn_in, c=1.0, iota=iota)
    assert beta[0] == 0.0
    assert beta[1] == pytest.approx(np.sqrt(H**3))  # the burn-in term makes the Hoeffding cap bind
    assert beta[3] == pytest.approx(np.sqrt(H * (2.0 + H) / 1e6) + burn_in / 1e6)


def test_min_gap_without_a_suboptimal_action_is_infinite_and_messages_need_every_array():
    P = np.full((2, 2, 2, 2), 0.5)
    flat = TabularMDP(P, np.full((2, 2, 2), 0.3), np.array([0.5, 0.5]))  # every action is optimal
    assert flat.min_gap() == float("inf")
    message = flat.to_message()
    partial = Message(arrays={"rewards": message.arrays["rewards"]})
    with pytest.raises(ValueError) as caught:
        TabularMDP.from_message(partial)
    assert (
        str(caught.value)
        == "an MDP needs the arrays transitions, rewards, initial; missing transitions, initial"
    )


@pytest.mark.parametrize("sizes", [(0, 2, 2), (2, 0, 2), (2, 2, 0)])
def test_random_mdp_refuses_an_empty_dimension(sizes):
    with pytest.raises(ValueError) as caught:
        random_mdp(*sizes, np.random.default_rng(0))
    assert str(caught.value) == f"states, actions and horizon must be >= 1, got {', '.join(map(str, sizes))}"
    assert random_mdp(1, 1, 1, np.random.default_rng(0)).transitions.shape == (1, 1, 1, 1)  # 1 is enough

"""Sharing rules: oracle clustering is pooled LinUCB inside each cluster; the baselines' mechanics by hand."""

import math

import numpy as np
import pytest

from taciturn.bandits.environments import clustered
from taciturn.bandits.exchange import Exchange, sample_message
from taciturn.bandits.linucb import Confidence
from taciturn.bandits.metrics import pair_f1
from taciturn.bandits.rules import Bass, Club, DynUcb, Independent, Oracle, Pooled, Sclub
from taciturn.bandits.rules.club import connected
from taciturn.bandits.rules.sclub import stage_of
from taciturn.bandits.simulation import Problem, Simulation
from taciturn.bandits.stats import AgentStats
from taciturn.core.codec import encode

CONF = Confidence(lam=1.0, noise_bound=1.0, norm_bound=3.0, delta=0.01, scale=0.5)


def restricted(problem: Problem, agents: np.ndarray) -> Problem:
    """The sub-problem of some agents: their rows, and the steps at which one of them acts."""
    steps = np.isin(problem.schedule[0], agents)
    return Problem(
        arms=problem.arms,
        means=problem.means[:, agents],
        labels=None,
        schedule=np.searchsorted(agents, problem.schedule[:, steps]),
        noise=problem.noise[:, steps],
        seeds=problem.seeds,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_clustering_is_pooled_linucb_run_within_each_cluster(seed):
    env = clustered(np.random.default_rng(seed), num_agents=7, num_arms=8, dim=4, num_clusters=3, noise=1.0)
    problem = Problem.build([env], [seed], horizon=600)
    oracle = Simulation(problem, Oracle(problem.labels), CONF, Exchange([seed]))
    oracle.advance(600)
    regret, traffic = 0.0, 0
    for cluster in range(3):
        agents = np.flatnonzero(env.labels == cluster)
        sub = restricted(problem, agents)
        pooled = Simulation(sub, Pooled(1, len(agents)), CONF, Exchange([seed]))
        pooled.advance(sub.horizon)
        np.testing.assert_allclose(oracle.pool_gram[0, agents], pooled.pool_gram[0], rtol=1e-12)
        np.testing.assert_allclose(oracle.pool_b[0, agents], pooled.pool_b[0], rtol=1e-12, atol=1e-12)
        regret += pooled.regret[0]
        pooled.record()
        traffic += pooled.exchange.traffic
    np.testing.assert_allclose(oracle.regret[0], regret)
    oracle.record()
    assert (oracle.exchange.traffic == traffic).all()  # the same messages, byte for byte


def test_independent_agents_send_nothing_and_pooled_ones_send_every_sample_to_everyone():
    env = clustered(np.random.default_rng(3), num_agents=4, num_arms=6, dim=3, num_clusters=2, noise=1.0)
    problem = Problem.build([env], [3], horizon=50)
    alone = Simulation(problem, Independent(1, 4), CONF, Exchange([3]))
    alone.advance(50)
    alone.record()
    assert alone.exchange.traffic.sum() == 0
    together = Simulation(problem, Pooled(1, 4), CONF, Exchange([3]))
    together.advance(50)
    together.record()
    size = len(encode(sample_message(np.zeros(3), 0.0)))
    up, down = together.exchange.traffic[0]
    assert up.tolist() == [50, 50, 50 * size, 50 * size]  # sent, delivered, bytes sent, bytes delivered
    assert down.tolist() == [150, 150, 150 * size, 150 * size]  # each sample reaches the 3 others
    np.testing.assert_allclose(
        together.pool_gram[0, 0], together.pool_gram[0, 3]
    )  # everyone holds everything


def test_a_dropped_forward_leaves_the_receivers_pool_without_the_sample():
    env = clustered(np.random.default_rng(4), num_agents=3, num_arms=6, dim=3, num_clusters=1, noise=1.0)
    problem = Problem.build([env], [4], horizon=40)
    lossy = Simulation(problem, Pooled(1, 3), CONF, Exchange([4], drop_down=1.0))
    lossy.advance(40)
    lossy.record()
    own = lossy.stats.gram[0] + np.eye(3)  # the server still has every sample (uploads arrive)
    np.testing.assert_allclose(lossy.pool_gram[0], own)  # but each agent holds only its own
    assert lossy.exchange.traffic[0, 1, 1] == 0 and lossy.exchange.traffic[0, 1, 0] == 80


def test_connected_components_of_a_hand_graph():
    graph = np.eye(5, dtype=bool)
    for i, j in [(0, 1), (1, 2), (3, 4)]:
        graph[i, j] = graph[j, i] = True
    reach = connected(graph[None])[0]
    assert reach[0, 2] and reach[2, 0] and reach[3, 4] and not reach[0, 3] and not reach[2, 4]


def stats_with(thetas, counts) -> AgentStats:
    """Agent statistics whose ridge estimates are exactly ``thetas`` (Gram = count * I); ``thetas``
    (N, d) for one repetition or (R, N, d) for several."""
    thetas, counts = np.asarray(thetas, float), np.asarray(counts)
    thetas = thetas if thetas.ndim == 3 else thetas[None]
    reps, agents, dim = thetas.shape
    stats = AgentStats(reps, agents, dim, lam=1.0)
    counts = np.broadcast_to(counts, (reps, agents))
    state = {
        "gram": (counts[..., None, None] * np.eye(dim)).astype(float),
        "b": (counts[..., None] + 1.0) * thetas,
        "count": counts.copy(),
    }
    stats.load(state)
    return stats


def test_club_cuts_an_edge_when_estimates_differ_by_more_than_the_widths():
    stats = stats_with([[0.0, 0.0], [0.05, 0.0], [2.0, 0.0]], [100, 100, 100])
    club = Club(1, 3, gamma=1.0)  # widths sqrt((1 + ln 101) / 101) = 0.24 each: cut iff distance > 0.48
    club.update(stats, np.array([0]), np.array([0]), step=0)
    assert club.graph[0].tolist() == [[True, True, False], [True, True, True], [False, True, True]]
    assert club.membership[0].all()  # 0 and 2 still share through 1: CLUB pools over components
    club.update(stats, np.array([0]), np.array([2]), step=1)
    assert club.membership[0].tolist() == [[True, True, False], [True, True, False], [False, False, True]]


def test_sclub_splits_a_far_agent_and_merges_checked_clusters_that_agree():
    assert [stage_of(t) for t in (0, 1, 2, 5, 6, 13, 14)] == [1, 1, 2, 2, 3, 3, 4]
    stats = stats_with([[0.0, 0.0], [0.0, 0.0], [3.0, 0.0]], [200, 200, 200])
    sclub = Sclub(1, 3, dim=2, alpha=1.0)
    sclub.update(stats, np.array([0]), np.array([2]), step=0)  # pivot of the 3-agent cluster is (1, 0)
    assert sclub.labels[0, 2] != sclub.labels[0, 0] == sclub.labels[0, 1]
    stats = stats_with([[0.0, 0.0], [0.0, 0.0], [0.01, 0.0]], [200, 200, 200])  # agent 2 now agrees
    for agent in (0, 1):
        sclub.update(stats, np.array([0]), np.array([agent]), step=1)
    assert sclub.checked[0].all()  # every cluster checked: the two merge back into one
    assert len(set(sclub.labels[0])) == 1 and sclub.membership[0].all()


def test_dynucb_moves_an_agent_to_the_nearest_cluster():
    stats = stats_with([[1.0, 0.0], [1.0, 0.1], [-1.0, 0.0], [-1.0, 0.0]], [50, 50, 50, 50])
    dyn = DynUcb(np.array([[0, 0, 1, 0]]), num_clusters=2)  # agent 3 sits with the wrong cluster
    dyn.update(stats, np.array([0]), np.array([3]), step=0)
    assert dyn.labels[0].tolist() == [0, 0, 1, 1]
    assert dyn.membership[0, 3].tolist() == [False, False, True, True]


def test_pair_f1_by_hand():
    labels = np.array([[0, 0, 1, 1]])  # true pairs: (0,1), (2,3)
    guess = np.eye(4, dtype=bool)
    guess[0, 1] = guess[1, 0] = guess[1, 2] = guess[2, 1] = True  # predicts (0,1) right, (1,2) wrong
    assert pair_f1(guess[None], labels)[0] == pytest.approx(2 * 1 / (2 * 1 + 1 + 1))
    apart = np.array([[0, 1]])
    assert pair_f1(np.eye(2, dtype=bool)[None], apart)[0] == 1.0  # nothing to find, nothing claimed
    assert pair_f1(np.ones((1, 2, 2), dtype=bool), apart)[0] == 0.0


def test_club_threshold_is_the_sum_of_both_agents_widths():
    """CB_i + CB_j with unequal widths: agent 0 has 100 samples, agents 1 and 2 none, so one
    distance just inside the sum and one just outside tell the sum from either width alone."""

    def width(count):  # CB = gamma sqrt((1 + ln(1 + T)) / (1 + T)), gamma = 1
        return math.sqrt((1 + math.log(1 + count)) / (1 + count))

    threshold = width(100) + width(0)  # 0.2402 + 1
    stats = stats_with([[0.0, 0.0], [threshold - 0.01, 0.0], [0.0, threshold + 0.01]], [100, 0, 0])
    club = Club(1, 3)  # gamma = 1 by default
    club.update(stats, np.array([0]), np.array([0]), step=0)
    assert club.graph[0, 0].tolist() == [True, True, False]
    doubled = Club(1, 3, gamma=2.0)  # gamma scales both widths: nothing is that far apart
    doubled.update(stats, np.array([0]), np.array([0]), step=0)
    assert doubled.graph[0, 0].all()


def test_each_rule_restored_from_its_state_has_the_same_pools():
    """state() -> load() into a fresh rule (a resumed run): the same memberships and state arrays."""
    stats = stats_with([[0.0, 0.0], [0.05, 0.0], [2.0, 0.0]], [100, 100, 100])
    club = Club(1, 3)
    club.update(stats, np.array([0]), np.array([2]), step=0)  # 2 is cut off from both
    sclub = Sclub(1, 3, dim=2)
    sclub.update(stats_with([[0.0, 0.0], [0.0, 0.0], [3.0, 0.0]], [200] * 3), np.array([0]), np.array([2]), 0)
    dyn = DynUcb(np.array([[0, 0, 1]]), num_clusters=2)
    dyn.update(stats, np.array([0]), np.array([1]), step=0)
    bass = Bass(1, 3, CONF)
    bass.membership[0] = [[True, True, False], [True, True, False], [False, False, True]]
    fresh = {
        "club": Club(1, 3),
        "sclub": Sclub(1, 3, dim=2),
        "dynucb": DynUcb(np.zeros((1, 3), dtype=np.int64), num_clusters=2),
        "bass": Bass(1, 3, CONF),
    }
    for name, rule in {"club": club, "sclub": sclub, "dynucb": dyn, "bass": bass}.items():
        assert not rule.membership.all(), name  # something to restore
        twin = fresh[name]
        twin.load({k: v.copy() for k, v in rule.state().items()})
        assert np.array_equal(twin.membership, rule.membership), name
        for key, value in rule.state().items():
            assert np.array_equal(twin.state()[key], value), (name, key)
    assert club.membership[0].tolist() == [[True, True, False], [True, True, False], [False, False, True]]
    assert sclub.membership[0].tolist() == [[True, True, False], [True, True, False], [False, False, True]]


def test_rules_that_regroup_hear_every_sample_even_from_an_agent_with_nobody_to_share_with():
    """DynUCB with each agent alone in its cluster still uploads everything (an agent may join a
    cluster later); independent agents, whose pools never grow, upload nothing."""
    env = clustered(np.random.default_rng(5), num_agents=2, num_arms=6, dim=3, num_clusters=2, noise=1.0)
    problem = Problem.build([env], [5], horizon=30)
    apart = Simulation(problem, DynUcb(np.array([[0, 1]]), num_clusters=2), CONF, Exchange([5]))
    apart.advance(30)
    apart.record()
    assert apart.exchange.traffic[0, 0, 0] == 30  # every step's sample went up
    sclub = Sclub(1, 2, dim=3)
    sclub.load(sclub.state() | {"labels": np.array([[0, 1]])})  # two singleton clusters
    alone = Simulation(problem, sclub, CONF, Exchange([5]))
    alone.advance(30)
    alone.record()
    assert alone.exchange.traffic[0, 0, 0] == 30


def test_bad_rule_settings_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"initial labels must lie in \[0, 2\)"):
        DynUcb(np.array([[0, 2]]), num_clusters=2)
    with pytest.raises(ValueError, match=r"initial labels must lie in \[0, 2\)"):
        DynUcb(np.array([[-1, 0]]), num_clusters=2)
    with pytest.raises(
        ValueError,
        match="unknown separation test 'nope'; choose one of mahalanobis, ellipsoid_overlap, "
        "ellipsoid_overlap_bandpy",
    ):
        Bass(1, 2, CONF, test="nope")


def test_rules_decide_each_repetition_as_if_it_ran_alone():
    """Two repetitions in one batch, with estimates away from the origin and different outcomes
    (one cuts or splits, the other does not): each matches the same rule run on that repetition alone."""
    club_thetas = [[[1.0, 0.0], [1.1, 0.0], [3.0, 0.0]], [[0.0, 1.0], [0.0, 1.05], [0.0, 1.2]]]
    sclub_thetas = [[[0.0, 1.0], [0.0, 1.0], [0.0, 4.0]], [[1.0, 0.0], [1.0, 0.0], [1.2, 0.0]]]
    dyn_thetas = [
        [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.9, 0.3]],
        [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [-0.8, 0.2]],
    ]
    labels = np.array([[0, 1, 2, 1], [0, 1, 2, 0]])
    cases = {
        "club": (lambda r: Club(r, 3), club_thetas, [100] * 3, [0, 2], lambda rule: rule.graph),
        "sclub": (lambda r: Sclub(r, 3, dim=2), sclub_thetas, [200] * 3, [2, 2], lambda rule: rule.labels),
        "dynucb": (
            lambda r, reps=slice(None): DynUcb(labels[reps], num_clusters=3),
            dyn_thetas,
            [50] * 4,
            [3, 3],
            lambda rule: rule.labels,
        ),
    }
    outcomes = {}
    for name, (make, thetas, counts, active, kept) in cases.items():
        batch = make(2)
        batch.update(stats_with(thetas, counts), np.array([0, 1]), np.array(active), step=0)
        for r in (0, 1):
            alone = make(1) if name != "dynucb" else make(1, slice(r, r + 1))
            alone.update(stats_with(thetas[r], counts), np.array([0]), np.array([active[r]]), step=0)
            assert np.array_equal(batch.membership[r], alone.membership[0]), (name, r)
            assert np.array_equal(kept(batch)[r], kept(alone)[0]), (name, r)
        outcomes[name] = kept(batch).tolist()
    # by hand: CLUB cuts 0-2 in repetition 0 (distance 2 > 2 x 0.24) and nothing in repetition 1 (0.2, 0.15)
    assert outcomes["club"][0][0] == [True, True, False] and np.array(outcomes["club"][1]).all()
    # SCLUB: pivot (0, 1206 / 601): agent 2 is 2.0 away in repetition 0 (split), and 0.13 in repetition 1,
    # between F(200) - F(600) = 0.066 and F(200) + F(600) = 0.288 (no split)
    assert outcomes["sclub"] == [[0, 0, 1], [0, 0, 0]]
    # DynUCB: agent 3 moves to the cluster whose pooled estimate is nearest: 0 in repetition 0, 2 in 1
    assert outcomes["dynucb"] == [[0, 1, 2, 0], [0, 1, 2, 2]]


def test_sclub_keeps_a_lone_agent_and_freezes_pivots_for_a_stage():
    stats = stats_with([[0.0, 1.0], [0.0, 1.0], [0.0, 4.0]], [200] * 3)
    sclub = Sclub(1, 3, dim=2)  # alpha = 1 by default
    sclub.update(stats, np.array([0]), np.array([2]), step=0)  # stage 1: 2 splits off, pivot (0, 4)
    assert sclub.labels[0].tolist() == [0, 0, 1] and sclub.checked[0].tolist() == [False, False, True]
    pivot = sclub.pivot_theta[0].copy()
    moved = stats_with([[0.0, 1.0], [0.0, 1.0], [0.0, 8.0]], [200] * 3)
    sclub.update(moved, np.array([0]), np.array([2]), step=1)  # same stage: alone, so no split
    assert sclub.labels[0].tolist() == [0, 0, 1] and np.array_equal(sclub.pivot_theta[0], pivot)
    sclub.update(moved, np.array([0]), np.array([0]), step=2)  # stage 2: pivots anew, checks reset
    assert sclub.stage[0] == 2 and sclub.checked[0].tolist() == [True, False, False]
    np.testing.assert_allclose(sclub.pivot_theta[0, 1], [0.0, 8.0])  # cluster 1 = agent 2: its estimate
    assert set(sclub.state()) == {"labels", "checked", "stage", "pivot_theta", "pivot_count"}  # checkpoints


def test_fixed_and_initial_pools_by_hand():
    assert Independent(1, 3).membership[0].tolist() == np.eye(3, dtype=bool).tolist()
    dyn = DynUcb(np.array([[0, 0, 1, 0]]), num_clusters=2)
    assert dyn.membership[0, 3].tolist() == [True, True, False, True]
    oracle = Oracle(np.array([[1, 0, 1]]))
    assert oracle.membership[0].tolist() == [[True, False, True], [False, True, False], [True, False, True]]


def test_cluster_estimates_pool_the_members_by_hand():
    from taciturn.bandits.rules.clusters import cluster_estimates

    stats = stats_with([[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]], [100, 50, 10])
    members, theta, count = cluster_estimates(stats, np.array([0]), np.array([[0, 0, 1]]), 2)
    assert members[0].tolist() == [[True, True, False], [False, False, True]]
    # V_0 = lam I + 100 I + 50 I, b_0 = 101 (1, 0) + 51 (0, 2); cluster 1 is agent 2 alone
    np.testing.assert_allclose(theta[0], [[101 / 151, 102 / 151], [5.0, 5.0]], rtol=1e-12)
    assert count[0].tolist() == [150, 10]


def test_bass_tests_each_repetition_with_its_own_norm_bound():
    """The same two agents in two repetitions; only S differs (1 and 100): the small radius separates."""
    per_run = Confidence(lam=1.0, noise_bound=1.0, norm_bound=np.array([1.0, 100.0]), delta=0.05)
    stats = stats_with([[[0.0, 0.0], [3.0, 0.0]]] * 2, [100, 100])
    bass = Bass(2, 2, per_run)
    bass.update(stats, np.array([0, 1]), np.array([0, 0]), step=0)
    assert bass.membership[:, 0, 1].tolist() == [False, True]
    assert bass.membership[:, 1, 0].tolist() == [False, True] and bass.membership[:, [0, 1], [0, 1]].all()


@pytest.mark.parametrize(("fraction", "merged"), [(0.8, True), (1.3, False)])
def test_sclub_merges_checked_clusters_closer_than_half_their_widths(fraction, merged):
    """Clusters {0, 1} (400 samples, estimate (0, 402/401)) and {2} (200 samples) merge iff their
    distance is below alpha/2 (F(400) + F(200)), F(T) = sqrt((1 + ln(1 + T)) / (1 + T))."""

    def width(count):
        return math.sqrt((1 + math.log(1 + count)) / (1 + count))

    threshold = 0.5 * (width(400) + width(200))
    y = 402 / 401 + fraction * threshold
    stats = stats_with([[0.0, 1.0], [0.0, 1.0], [0.0, y]], [200, 200, 200])
    sclub = Sclub(1, 3, dim=2, alpha=1.0)
    sclub.load(sclub.state() | {"labels": np.array([[0, 0, 1]]), "checked": np.ones((1, 3), bool)})
    sclub._merge(stats, np.array([0]))
    assert (len(set(sclub.labels[0].tolist())) == 1) is merged

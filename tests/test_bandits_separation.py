"""Separation tests: exact against brute force, and statistically (equal kept, far apart separated)."""

import numpy as np
import pytest

from taciturn.bandits.environments import linear
from taciturn.bandits.exchange import Exchange
from taciturn.bandits.linucb import Confidence, ridge
from taciturn.bandits.rules import Bass
from taciturn.bandits.separation import bandpy_ellipsoids_disjoint, ellipsoids_disjoint, mahalanobis_separated
from taciturn.bandits.simulation import Problem, Simulation


def random_spd(rng, d, scale):
    m = rng.standard_normal((d, d))
    return scale * (m @ m.T + 0.5 * np.eye(d))


def test_ellipsoid_overlap_test_agrees_with_a_brute_force_search():
    """Disjoint iff some s in (0, 1) has d^T (Sigma_i / s + Sigma_j / (1 - s))^-1 d > 1 (Minkowski sum)."""
    rng = np.random.default_rng(1)
    conf = Confidence(lam=1.0, noise_bound=1.0, norm_bound=1.0, delta=0.1)
    checked = 0
    for _ in range(300):
        d = 3
        gram_i, gram_j = random_spd(rng, d, 4.0), random_spd(rng, d, 4.0)
        inv_i, theta_i, logdet_i = ridge(gram_i, rng.standard_normal(d) * 6)
        inv_j, theta_j, logdet_j = ridge(gram_j, rng.standard_normal(d) * 6)
        sigma_i = conf.radius(logdet_i, d) ** 2 * inv_i
        sigma_j = conf.radius(logdet_j, d) ** 2 * inv_j
        diff = theta_i - theta_j
        s = np.linspace(1e-4, 1 - 1e-4, 4001)[:, None, None]
        worst = np.einsum(
            "d,sd->s", diff, np.linalg.solve(sigma_i / s + sigma_j / (1 - s), diff[:, None])[..., 0]
        ).max()
        if abs(worst - 1.0) < 1e-2:
            continue  # too close to tangent for the grid to decide
        checked += 1
        assert ellipsoids_disjoint(theta_i, inv_i, logdet_i, theta_j, inv_j, logdet_j, conf) == (worst > 1.0)
    assert checked > 250


@pytest.mark.parametrize("bandpy", [False, True])
def test_overlap_tests_on_a_hand_pair_of_axis_aligned_ellipsoids(bandpy):
    """V_i = diag(16, 1), V_j = diag(4, 9), centres 0 and (g, 0), lam = 1, S = 1, delta = 0.05, scale 0.5.
    beta_k = sqrt(2 log 20 + log det V_k) + 1 and the V-radius is r_k = 0.5 beta_k (textbook) or
    sqrt(0.5 beta_k) (bandpy: shape 0.5 beta_k V^-1). Both ellipsoids are symmetric about the x axis
    and widest in x on it, so they are disjoint iff g > r_i / 4 + r_j / 2."""
    d, delta = 2, 0.05
    conf = Confidence(lam=1.0, noise_bound=1.0, norm_bound=1.0, delta=delta, scale=0.5)
    gram_i, gram_j = np.diag([16.0, 1.0]), np.diag([4.0, 9.0])
    beta_i = np.sqrt(2 * np.log(20) + np.log(16.0)) + 1.0
    beta_j = np.sqrt(2 * np.log(20) + np.log(36.0)) + 1.0
    if bandpy:
        r_i, r_j, test = np.sqrt(0.5 * beta_i), np.sqrt(0.5 * beta_j), bandpy_ellipsoids_disjoint
    else:
        r_i, r_j, test = 0.5 * beta_i, 0.5 * beta_j, ellipsoids_disjoint
    touching = r_i / 4 + r_j / 2
    inv_i, inv_j = np.linalg.inv(gram_i), np.linalg.inv(gram_j)
    logdet_i, logdet_j = np.log(16.0), np.log(36.0)
    for gap, disjoint in ((0.99 * touching, False), (1.01 * touching, True)):
        got = test(np.zeros(d), inv_i, logdet_i, np.array([gap, 0.0]), inv_j, logdet_j, conf)
        assert bool(got) is disjoint
    # and the two tests differ where it matters: beta > 1, so bandpy's ellipsoids are the smaller ones
    assert np.sqrt(0.5 * beta_i) / 4 + np.sqrt(0.5 * beta_j) / 2 < 0.5 * beta_i / 4 + 0.5 * beta_j / 2


def test_mahalanobis_test_on_a_hand_case():
    """V_i = V_j = n I: the statistic is ||diff||^2 n / 2 against beta_ij^2 of the 2d-dimensional problem."""
    d, n, lam = 2, 99.0, 1.0
    conf = Confidence(lam=lam, noise_bound=1.0, norm_bound=1.0, delta=0.05)
    gram = (n + lam) * np.eye(d)
    inverse, logdet = np.linalg.inv(gram), np.linalg.slogdet(gram)[1]
    beta = np.sqrt(2 * np.log(1 / 0.05) + 2 * d * np.log(n + lam)) + np.sqrt(2 * lam) * 1.0
    threshold = beta * np.sqrt(2 / (n + lam))  # ||diff|| at which the test fires
    for gap, separated in ((0.99 * threshold, False), (1.01 * threshold, True)):
        theta_j = np.array([gap, 0.0])
        got = mahalanobis_separated(np.zeros(d), inverse, logdet, theta_j, inverse, logdet, conf)
        assert bool(got) is separated


def two_agent_problem(theta_a, theta_b, repetitions, horizon):
    rng = np.random.default_rng(7)
    arms = rng.standard_normal((10, 5))
    env = linear(arms, np.stack([theta_a, theta_b]), 1.0, None)
    return Problem.build([env] * repetitions, list(range(repetitions)), horizon)


@pytest.mark.parametrize("test", ["mahalanobis", "ellipsoid_overlap"])
def test_bass_keeps_equal_agents_together_and_separates_far_apart_ones(test):
    """With the theory's radius (scale 1) a wrong separation has probability <= delta; far-apart
    parameters (||theta_1 - theta_2|| = 6) are separated within 300 steps in (nearly) every run."""
    reps, steps, delta = 40, 300, 0.05
    theta = np.array([1.5, -1.0, 0.5, 2.0, -0.5])
    conf = Confidence(lam=1.0, noise_bound=1.0, norm_bound=float(np.linalg.norm(theta)), delta=delta)
    outcome = {}
    for case, other in (("equal", theta), ("far", -theta)):
        problem = two_agent_problem(theta, other, reps, steps)
        simulation = Simulation(problem, Bass(reps, 2, conf, test), conf, Exchange(problem.seeds))
        simulation.advance(steps)
        outcome[case] = simulation.rule.membership[:, 0, 1].mean()  # fraction still sharing
    assert outcome["equal"] >= 1 - delta
    assert outcome["far"] <= 0.05


def test_mahalanobis_test_with_a_regulariser_and_norm_bound_other_than_one():
    """lam = 2, S = 3, V = 100 I: the pair's radius is sqrt(2 log(1/delta) + log(det V_i det V_j / lam^4))
    + sqrt(lam) sqrt(2) S = sqrt(2 log 20 + 4 log 50) + 6, against ||diff||^2 100 / 2."""
    d, lam = 2, 2.0
    conf = Confidence(lam=lam, noise_bound=1.0, norm_bound=3.0, delta=0.05)
    gram = 100.0 * np.eye(d)
    inverse, logdet = np.linalg.inv(gram), np.linalg.slogdet(gram)[1]
    beta = np.sqrt(2 * np.log(20) + 4 * np.log(50)) + 6.0
    threshold = beta / np.sqrt(50)
    for gap, separated in ((0.99 * threshold, False), (1.01 * threshold, True)):
        got = mahalanobis_separated(np.zeros(d), inverse, logdet, np.array([0.0, gap]), inverse, logdet, conf)
        assert bool(got) is separated

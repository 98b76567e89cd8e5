"""LinUCB on a hand-computed case, and the confidence radius of Abbasi-Yadkori et al. (2011)."""

import numpy as np
import pytest

from taciturn.bandits.linucb import Confidence, ridge, ucb_choice, ucb_scores

# Four pulls of e1 (rewards summing to 3.0) and one of e2 (reward 0.8), lam = 1:
# A = diag(5, 2), b = (3.0, 0.8), theta_hat = (0.6, 0.4), ||e1||_{A^-1} = sqrt(1/5), ||e2||_{A^-1} = sqrt(1/2)
GRAM = np.diag([5.0, 2.0])
B = np.array([3.0, 0.8])
ARMS = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
# beta = R sqrt(2 log(1/delta) + log(det A / lam^d)) + sqrt(lam) S with R = S = 1, delta = 1/2, det A = 10
BETA = np.sqrt(2 * np.log(2) + np.log(10)) + 1.0


def confidence(scale: float) -> Confidence:
    return Confidence(lam=1.0, noise_bound=1.0, norm_bound=1.0, delta=0.5, scale=scale)


def test_ridge_and_radius_match_the_hand_computation():
    inverse, theta, logdet = ridge(GRAM, B)
    np.testing.assert_allclose(theta, [0.6, 0.4])
    np.testing.assert_allclose(inverse, np.diag([0.2, 0.5]))
    assert logdet == pytest.approx(np.log(10))
    assert confidence(1.0).radius(logdet, 2) == pytest.approx(BETA)
    assert confidence(0.5).radius(logdet, 2) == pytest.approx(BETA / 2)


@pytest.mark.parametrize(("scale", "chosen"), [(0.2, 0), (0.3, 1)])
def test_linucb_picks_the_arm_with_the_highest_optimistic_index(scale, chosen):
    rho = scale * BETA  # e2 wins iff 0.4 + rho sqrt(1/2) > 0.6 + rho sqrt(1/5), i.e. rho > 0.7696
    expected = [0.6 + rho * np.sqrt(0.2), 0.4 + rho * np.sqrt(0.5), -0.6 + rho * np.sqrt(0.2)]
    np.testing.assert_allclose(ucb_scores(GRAM, B, ARMS, confidence(scale)), expected)
    assert ucb_choice(GRAM, B, ARMS, confidence(scale)) == chosen


def test_choices_are_batched_over_leading_axes():
    grams = np.stack([GRAM, GRAM, np.diag([2.0, 5.0])])
    bs = np.stack([B, B, B[::-1]])
    arms = np.broadcast_to(ARMS, (3, *ARMS.shape))
    got = ucb_choice(grams, bs, arms, confidence(0.2))
    expected = [ucb_choice(g, b, ARMS, confidence(0.2)) for g, b in zip(grams, bs, strict=True)]
    assert got.tolist() == expected == [0, 0, 1]


@pytest.mark.parametrize(("scale", "locked"), [(0.15, True), (1.0, False)])
def test_a_shrunk_radius_locks_a_pool_onto_a_suboptimal_arm(scale, locked):
    """The mechanism of the heavy tail in benchmarks/bass.py (issue 19). theta = (1, 1.2): e2 is the
    best arm. The pool holds 100 noise-free pulls of e1 and one pull of e2 whose noise was -1 (reward
    0.2). Every further pull of e1 leaves e2's estimate (0.1) and width (1/sqrt(2)) unchanged, and
    beta grows only like sqrt(log n): at scale 0.15, e2's index 0.1 + 0.15 beta / sqrt(2) stays below
    e1's (about 1) until beta >= 8.5, i.e. for about e^39 more pulls; at scale 1 (the theory) e2 is
    pulled at once."""
    theta = np.array([1.0, 1.2])
    arms = np.eye(2)
    conf = Confidence(
        lam=1.0, noise_bound=1.0, norm_bound=float(np.linalg.norm(theta)), delta=0.01, scale=scale
    )
    gram, b = np.diag([101.0, 2.0]), np.array([100.0, 0.2])
    pulls = []
    for _ in range(2000):
        arm = int(ucb_choice(gram, b, arms, conf))
        pulls.append(arm)
        gram += np.outer(arms[arm], arms[arm])
        b += arms[arm] * (arms[arm] @ theta)  # noise-free from here on
    assert (1 not in pulls) is locked
    if locked:  # by hand after the 2000 pulls of e1: beta = sqrt(2 log 100 + log(2101 * 2)) + |theta|
        beta = np.sqrt(2 * np.log(100) + np.log(2101 * 2)) + np.linalg.norm(theta)
        index_e2 = 0.1 + scale * beta / np.sqrt(2)
        np.testing.assert_allclose(ucb_scores(gram, b, arms, conf)[1], index_e2)
        assert index_e2 < 2100 / 2101  # below e1's estimate alone, before any bonus

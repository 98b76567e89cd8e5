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

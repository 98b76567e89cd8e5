"""Separation tests: has the data shown that two agents' parameters differ?

BASS (Cherkaoui, Barlier and Colin, "Adaptive Sample Sharing for Multi-Agent Linear Bandits",
ICML 2025, arXiv 2309.08710) lets agent i use agent j's samples until a separation test says
theta_i != theta_j. Its main result weighs the *bias* that j's samples add to i's estimate against
the *uncertainty* they remove, in a Mahalanobis (anisotropic) norm. We could not read the
paper's statement of the test (only its abstract was reachable), so ``mahalanobis_separated``
below is our derivation of a test with exactly that structure. ``bandpy_ellipsoids_disjoint`` is
the exact ellipsoid-overlap test of the authors' earlier code (bandpy ``controllers.LBC``), with its
ellipsoids of V-radius sqrt(beta); ``ellipsoids_disjoint`` is the same test on the textbook
confidence ellipsoids of V-radius beta.

Every test takes a Confidence whose ``scale`` multiplies beta. The guarantees stated below hold at
scale >= 1 only; below 1 (where benchmarks/bass.py tunes it) the test is a tuned heuristic and a
wrong separation has no probability bound.

Bias against uncertainty. If agent i pools its samples with agent j's, its estimate moves by the
bias A^-1 G_j (theta_j - theta_i) (G_j: the Gram matrix of j's samples) while its confidence
width shrinks. The bias is invisible as long as theta_i - theta_j hides inside the uncertainty of
the two estimates; the first moment it provably does not, sharing hurts and the agents separate.
Stack the two agents' regressions into one 2d-dimensional ridge regression (block-diagonal Gram
diag(V_i, V_j)): Abbasi-Yadkori et al. 2011, Thm 2, gives, with probability >= 1 - delta, for all
times, ||theta_hat_i - theta_i||^2_{V_i} + ||theta_hat_j - theta_j||^2_{V_j} <= beta_ij^2 with

    beta_ij = R sqrt(2 log(1/delta) + log(det V_i det V_j / lam^(2d))) + sqrt(2 lam) S.

If theta_i = theta_j, the difference of the estimates e = theta_hat_i - theta_hat_j is then
confined to {e : e^T (V_i^-1 + V_j^-1)^-1 e <= beta_ij^2}, because
min_u ||u||^2_{V_i} + ||u - e||^2_{V_j} = e^T (V_i^-1 + V_j^-1)^-1 e. Hence the test

    separate i and j  iff  ||theta_hat_i - theta_hat_j||_{(V_i^-1 + V_j^-1)^-1} > beta_ij,

which wrongly separates two equal parameters with probability at most delta over the whole run,
weighs each direction by the information both agents hold in it (anisotropic: a difference along
a direction neither agent has explored does not count, and does not hurt either agent's choices
yet), and separates two agents as soon as ||theta_i - theta_j||_{(V_i^-1 + V_j^-1)^-1} > 2 beta_ij,
i.e. as soon as the bias exceeds twice the uncertainty. Compared with the overlap test below, one
confidence region for the pair (one delta, one log-determinant term each) replaces two separate
ones, so it separates earlier at the same error level.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from taciturn.bandits.linucb import Confidence

NEWTON_STEPS = 20


def mahalanobis_separated(
    theta_i: np.ndarray,
    inverse_i: np.ndarray,
    logdet_i: np.ndarray,
    theta_j: np.ndarray,
    inverse_j: np.ndarray,
    logdet_j: np.ndarray,
    confidence: Confidence,
) -> np.ndarray:
    """BASS's bias-vs-uncertainty test (module docstring), batched over leading axes.

    ``theta_*`` (..., d) ridge estimates, ``inverse_*`` (..., d, d) inverse Gram matrices
    V^-1 (regularised), ``logdet_*`` (...) log det V. Returns True where the pair is separated.
    """
    dim = theta_i.shape[-1]
    diff = theta_i - theta_j
    distance2 = np.einsum(
        "...d,...d->...", diff, np.linalg.solve(inverse_i + inverse_j, diff[..., None])[..., 0]
    )
    pair = dataclasses.replace(confidence, norm_bound=np.sqrt(2) * confidence.norm_bound)
    return distance2 > pair.radius(logdet_i + logdet_j, 2 * dim) ** 2


def ellipsoids_disjoint(
    theta_i: np.ndarray,
    inverse_i: np.ndarray,
    logdet_i: np.ndarray,
    theta_j: np.ndarray,
    inverse_j: np.ndarray,
    logdet_j: np.ndarray,
    confidence: Confidence,
) -> np.ndarray:
    """True where the confidence ellipsoids E_k = {theta : ||theta - theta_hat_k||_{V_k} <= beta_k}
    of the two agents do not intersect: the textbook ellipsoids of Thm 2 (shape beta_k^2 V_k^-1).

    If theta_i = theta_j, both ellipsoids contain it with probability >= 1 - 2 delta (one delta per
    agent), so at scale 1 a wrong separation has probability at most 2 delta over the whole run.
    """
    dim = theta_i.shape[-1]
    beta_i = confidence.radius(logdet_i, dim)[..., None, None]
    beta_j = confidence.radius(logdet_j, dim)[..., None, None]
    return shapes_disjoint(theta_i, beta_i**2 * inverse_i, theta_j, beta_j**2 * inverse_j)


def bandpy_ellipsoids_disjoint(
    theta_i: np.ndarray,
    inverse_i: np.ndarray,
    logdet_i: np.ndarray,
    theta_j: np.ndarray,
    inverse_j: np.ndarray,
    logdet_j: np.ndarray,
    confidence: Confidence,
) -> np.ndarray:
    """The overlap test exactly as bandpy ``LBC._update_clusters`` runs it: shape matrices
    beta_k V_k^-1 (``inv_A_local * eps_i``, ``chol_A_local / sqrt(eps_j)``), not beta_k^2 V_k^-1.

    Its ellipsoids are {theta : ||theta - theta_hat_k||_{V_k} <= sqrt(scale beta_k)} (beta_k without
    the scale): inside the confidence ellipsoids of Thm 2 unless scale >= beta_k, and beta_k >=
    sqrt(2 log(1/delta)) > 1 for delta < 0.6. It separates earlier than ``ellipsoids_disjoint`` at
    the same scale, and its delta guarantee holds only where scale >= beta_k.
    """
    dim = theta_i.shape[-1]
    beta_i = confidence.radius(logdet_i, dim)[..., None, None]
    beta_j = confidence.radius(logdet_j, dim)[..., None, None]
    return shapes_disjoint(theta_i, beta_i * inverse_i, theta_j, beta_j * inverse_j)


def shapes_disjoint(
    centre_i: np.ndarray, sigma_i: np.ndarray, centre_j: np.ndarray, sigma_j: np.ndarray
) -> np.ndarray:
    """True where {x : (x - c_i)^T Sigma_i^-1 (x - c_i) <= 1} and the same for j do not intersect.

    Exact test of Gilitschenski and Hanebeck ("A robust computational test for overlap of two
    arbitrary-dimensional ellipsoids", 2012): with the generalised eigenpairs (l_m, phi_m) of
    Sigma_j phi = l Sigma_i phi (Phi^T Sigma_i Phi = I) and v = Phi^T (c_i - c_j), the ellipsoids
    are disjoint iff min_{s in [0, 1]} K(s) < 0 with K(s) = 1 - sum_m v_m^2 s (1 - s) / (1 + s (l_m - 1)).
    K is convex (K'' = sum 2 v^2 l / (1 + s(l - 1))^3 > 0); we minimise it by projected Newton from
    s = 1/2, as bandpy's ``K_min`` does (it stops after 10 steps; we take 20).
    """
    chol_inverse = np.linalg.inv(np.linalg.cholesky(sigma_i))  # L^-1 with Sigma_i = L L^T
    whitened = chol_inverse @ sigma_j @ np.swapaxes(chol_inverse, -1, -2)
    eigenvalues, eigenvectors = np.linalg.eigh(whitened)  # Phi = L^-T U
    v2 = (
        np.einsum("...dm,...d->...m", eigenvectors, (chol_inverse @ (centre_i - centre_j)[..., None])[..., 0])
        ** 2
    )
    a = eigenvalues - 1.0
    s = np.full(v2.shape[:-1], 0.5)
    for _ in range(NEWTON_STEPS):
        denom = 1.0 + s[..., None] * a
        slope = -np.sum(v2 * (1.0 - 2.0 * s[..., None] - a * s[..., None] ** 2) / denom**2, axis=-1)
        curvature = np.sum(v2 * 2.0 * eigenvalues / denom**3, axis=-1)
        s = np.clip(s - slope / np.maximum(curvature, 1e-300), 0.0, 1.0)
    k_min = 1.0 - np.sum(v2 * s[..., None] * (1.0 - s[..., None]) / (1.0 + s[..., None] * a), axis=-1)
    return k_min < 0.0


TESTS = {
    "mahalanobis": mahalanobis_separated,
    "ellipsoid_overlap": ellipsoids_disjoint,
    "ellipsoid_overlap_bandpy": bandpy_ellipsoids_disjoint,
}

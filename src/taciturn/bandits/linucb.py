"""Ridge statistics and the optimistic (LinUCB / OFUL) arm choice, batched over leading axes.

An agent that has seen samples (x_s, r_s) keeps the Gram matrix A = lam*I + sum x_s x_s^T and
b = sum r_s x_s; its ridge estimate is theta = A^-1 b. Abbasi-Yadkori, Pal and Szepesvari,
"Improved Algorithms for Linear Stochastic Bandits" (NeurIPS 2011), Theorem 2: with probability
at least 1 - delta, for all times, ||theta_hat - theta||_A <= beta(A) with

    beta(A) = R * sqrt(2 log(1/delta) + log(det A / lam^d)) + sqrt(lam) * S,        (Thm 2)

R the sub-Gaussian scale of the noise and S >= ||theta||. OFUL pulls the arm maximising
<theta_hat, x> + beta(A) ||x||_{A^-1}.

``Confidence.scale`` multiplies beta. scale = 1 is the theory, whose radius is conservative by a
large constant factor; bandit experiments tune the factor of the bonus (bandpy's ``alpha``). The
separation tests (separation.py) take their own Confidence, with their own scale.

The authors' package (bandpy, ``_criterions._f_ucb``) uses the bonus
alpha * sqrt(log(t + 1)) ||x||_{A^-1} with t the global clock instead of beta(A). We use beta(A) of the data
the agent acts on, so an agent's choice depends on its data alone (which is what makes oracle
clustering exactly pooled LinUCB run inside each cluster) and the same radius serves the
separation tests (separation.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Confidence:
    """The constants of the confidence radius beta (Thm 2 above)."""

    lam: float  # ridge regularisation
    noise_bound: float  # R: the noise is R-sub-Gaussian
    # S >= ||theta|| for every agent: one number, or one per repetition (R,), each repetition's own
    # bound, so that a repetition's numbers do not depend on which others run beside it.
    norm_bound: float | np.ndarray
    delta: float  # the bound holds with probability >= 1 - delta
    scale: float = 1.0  # multiplies the radius (1 = the theory)

    def radius(self, logdet: np.ndarray, dim: int) -> np.ndarray:
        """scale * beta for Gram matrices with log-determinant ``logdet`` (any shape; with one S per
        repetition, its leading axis is the repetition)."""
        log_ratio = np.maximum(logdet - dim * np.log(self.lam), 0.0)  # det A >= lam^d; clip rounding
        s = np.asarray(self.norm_bound)
        s = s.reshape(s.shape + (1,) * (np.ndim(logdet) - s.ndim))
        beta = self.noise_bound * np.sqrt(2 * np.log(1 / self.delta) + log_ratio) + np.sqrt(self.lam) * s
        return self.scale * beta

    def of(self, reps: np.ndarray) -> Confidence:
        """The constants of the repetitions ``reps`` (a per-repetition S is taken at ``reps``)."""
        if np.ndim(self.norm_bound) == 0:
            return self
        return dataclasses.replace(self, norm_bound=np.asarray(self.norm_bound)[reps])


def ridge(gram: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^-1, theta_hat = A^-1 b, log det A) for Gram matrices ``gram`` (..., d, d) and ``b`` (..., d)."""
    inverse = np.linalg.inv(gram)
    theta = np.einsum("...de,...e->...d", inverse, b)
    return inverse, theta, np.linalg.slogdet(gram)[1]


def ucb_scores(gram: np.ndarray, b: np.ndarray, arms: np.ndarray, confidence: Confidence) -> np.ndarray:
    """Optimistic indices <theta_hat, x_k> + scale * beta(A) * ||x_k||_{A^-1}, shape (..., K).

    ``gram`` (..., d, d), ``b`` (..., d), ``arms`` (..., K, d).
    """
    inverse, theta, logdet = ridge(gram, b)
    means = np.einsum("...kd,...d->...k", arms, theta)
    widths = np.sqrt(np.einsum("...kd,...de,...ke->...k", arms, inverse, arms))
    bonus = confidence.radius(logdet, gram.shape[-1])
    return means + bonus[..., None] * widths


def ucb_choice(gram: np.ndarray, b: np.ndarray, arms: np.ndarray, confidence: Confidence) -> np.ndarray:
    """The arm each agent pulls: argmax of ``ucb_scores`` (the first one on ties)."""
    return np.argmax(ucb_scores(gram, b, arms, confidence), axis=-1)

"""A recommendation-style environment built from a ratings matrix: users are agents, items are arms.

The expected reward of item k for user i is the (completed) rating R[i, k]; the arm features come
from item attributes: an intercept and the top principal components of the attribute matrix
(MovieLens: genre indicators). Missing ratings are filled by a low-rank completion, as the
authors' loader does (bandpy ``_fill_mising_values`` uses a matrix factorisation). Ratings are
not linear in the features, so every method is misspecified here: this environment measures
what sharing buys on data rather than on the model.

With MovieLens files (``ratings.csv`` and ``movies.csv`` of ml-latest-small or any ml-latest /
ml-25m / ml-32m release) the ``num_items`` most-rated movies are the arms and the ``num_users``
users who rated most of them are the agents; the true user clusters are unknown. Without them, a
synthetic low-rank ratings matrix stands in: users fall into groups sharing one taste vector
(the true clusters), items have random factors, and the item attributes are those factors
observed with noise.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from taciturn.bandits.environments import Environment
from taciturn.data.datasets import DatasetNotFound

RATING_RANGE = (0.5, 5.0)  # MovieLens' star scale
MOVIELENS_FILES = ("ratings.csv", "movies.csv")


class RatingsNotFound(DatasetNotFound):
    """MovieLens files are missing where the config says they are."""


def item_features(attributes: np.ndarray, dim: int) -> np.ndarray:
    """(K, p) item attributes -> (K, dim) arm features: [1, standardised top dim-1 principal components]."""
    centred = attributes - attributes.mean(axis=0)
    left, singular, _ = np.linalg.svd(centred, full_matrices=False)
    scores = left[:, : dim - 1] * singular[: dim - 1]
    scale = scores.std(axis=0)
    scores = np.where(scale > 1e-12, scores / np.where(scale > 1e-12, scale, 1.0), 0.0)
    padded = np.zeros((len(attributes), dim - 1))
    padded[:, : scores.shape[1]] = scores  # fewer components than dim - 1: zero features
    return np.hstack([np.ones((len(attributes), 1)), padded])


def complete(ratings: np.ndarray, rank: int, iterations: int = 200) -> np.ndarray:
    """Fill the NaN entries of a ratings matrix with a rank-``rank`` fit (hard-impute: alternate a
    truncated SVD with restoring the observed entries), clipped to the rating range."""
    observed = ~np.isnan(ratings)
    seen = observed.sum(axis=0)
    column_mean = np.where(observed, ratings, 0.0).sum(axis=0) / np.maximum(seen, 1)
    column_mean = np.where(seen > 0, column_mean, ratings[observed].mean())  # unrated item: overall mean
    filled = np.where(observed, ratings, column_mean)
    for _ in range(iterations):
        left, singular, right = np.linalg.svd(filled, full_matrices=False)
        low_rank = (left[:, :rank] * singular[:rank]) @ right[:rank]
        filled = np.where(observed, ratings, low_rank)
    return np.clip(filled, *RATING_RANGE)


def ratings_environment(
    ratings: np.ndarray, attributes: np.ndarray, dim: int, noise: float, labels: np.ndarray | None
) -> Environment:
    arms = item_features(attributes, dim)
    thetas = np.linalg.lstsq(arms, ratings.T, rcond=None)[0].T  # best linear fit, for the norm bound S
    return Environment(arms, ratings, noise, thetas, labels)


def synthetic(
    rng: np.random.Generator, num_users: int, num_items: int, rank: int, num_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratings (N, K), item attributes (K, rank), user groups (N,)): user i has the taste of group
    i mod G; rating = 3 + taste . item factors, clipped to the star range."""
    tastes = rng.standard_normal((num_groups, rank)) / np.sqrt(rank)
    factors = rng.standard_normal((num_items, rank))
    groups = np.arange(num_users) % num_groups
    ratings = np.clip(3.0 + tastes[groups] @ factors.T, *RATING_RANGE)
    attributes = factors + 0.1 * rng.standard_normal(factors.shape)
    return ratings, attributes, groups


def movielens(path: Path, num_users: int, num_items: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(completed ratings (num_users, num_items), genre indicators (num_items, genres)) from MovieLens."""
    missing = [name for name in MOVIELENS_FILES if not (path / name).is_file()]
    if missing:
        raise RatingsNotFound(
            f"{path} lacks {', '.join(missing)}: point environment.path at an unpacked MovieLens "
            "release with ratings.csv and movies.csv (e.g. ml-latest-small), or drop path for synthetic "
            "ratings"
        )
    with (path / "ratings.csv").open(newline="") as f:
        rows = [(int(r["userId"]), int(r["movieId"]), float(r["rating"])) for r in csv.DictReader(f)]
    users, items, values = (np.array(column) for column in zip(*rows, strict=True))
    movie_ids, movie_counts = np.unique(items, return_counts=True)
    if len(movie_ids) < num_items:
        raise ValueError(f"{path} rates {len(movie_ids)} movies, fewer than num_arms = {num_items}")
    chosen_items = np.sort(movie_ids[np.argsort(-movie_counts, kind="stable")[:num_items]])
    on_chosen = np.isin(items, chosen_items)
    user_ids, user_counts = np.unique(users[on_chosen], return_counts=True)
    if len(user_ids) < num_users:
        raise ValueError(
            f"only {len(user_ids)} users rated the chosen movies, fewer than num_agents = {num_users}"
        )
    chosen_users = np.sort(user_ids[np.argsort(-user_counts, kind="stable")[:num_users]])
    keep = on_chosen & np.isin(users, chosen_users)
    matrix = np.full((num_users, num_items), np.nan)
    matrix[np.searchsorted(chosen_users, users[keep]), np.searchsorted(chosen_items, items[keep])] = values[
        keep
    ]
    with (path / "movies.csv").open(newline="") as f:
        genres_of = {int(r["movieId"]): r["genres"].split("|") for r in csv.DictReader(f)}
    genres = sorted({g for m in chosen_items for g in genres_of.get(int(m), []) if g != "(no genres listed)"})
    attributes = np.array(
        [[g in genres_of.get(int(m), []) for g in genres] for m in chosen_items], dtype=float
    )
    return complete(matrix, rank), attributes.reshape(num_items, len(genres))

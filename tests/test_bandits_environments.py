"""Environments: the synthetic generators, the ratings matrix (synthetic and MovieLens files)."""

import numpy as np
import pytest

from taciturn.bandits import ratings
from taciturn.bandits.environments import clustered, unclustered


def test_clustered_environment_is_linear_with_agents_in_round_robin_clusters():
    env = clustered(np.random.default_rng(0), num_agents=7, num_arms=10, dim=5, num_clusters=3, noise=1.0)
    assert env.labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    np.testing.assert_allclose(env.means, env.thetas @ env.arms.T)
    assert (env.thetas[0] == env.thetas[3]).all() and not (env.thetas[0] == env.thetas[1]).all()
    assert env.norm_bound == pytest.approx(np.linalg.norm(env.thetas, axis=1).max())
    np.testing.assert_allclose(env.best, env.means.max(axis=1))


def test_unclustered_parameters_are_all_distinct_around_a_common_mean():
    env = unclustered(np.random.default_rng(0), num_agents=50, num_arms=10, dim=5, spread=0.1, noise=1.0)
    assert len(np.unique(env.thetas, axis=0)) == 50 and env.num_clusters == 50
    assert np.linalg.norm(env.thetas - env.thetas.mean(axis=0), axis=1).max() < 1.0


def test_item_features_are_an_intercept_and_standardised_principal_components():
    attributes = np.random.default_rng(1).standard_normal((12, 4))
    features = ratings.item_features(attributes, dim=4)
    assert features.shape == (12, 4) and (features[:, 0] == 1).all()
    np.testing.assert_allclose(features[:, 1:].std(axis=0), 1.0)
    np.testing.assert_allclose(
        features[:, 1:].T @ features[:, 1:] / 12, np.eye(3), atol=1e-12
    )  # uncorrelated
    assert (ratings.item_features(attributes[:, :1], dim=4)[:, 2:] == 0).all()  # too few attributes: zeros


def test_completion_recovers_a_low_rank_matrix_from_thirty_percent_missing():
    rng = np.random.default_rng(2)
    truth = 3 + 0.5 * rng.standard_normal((30, 2)) @ rng.standard_normal((2, 20))
    observed = truth.copy()
    observed[rng.random(truth.shape) < 0.3] = np.nan
    filled = ratings.complete(observed, rank=3)  # the offset adds one to the rank
    clipped = np.clip(truth, *ratings.RATING_RANGE)
    assert np.abs(filled - clipped).max() < 0.05
    assert (filled[~np.isnan(observed)] == np.clip(observed[~np.isnan(observed)], 0.5, 5)).all()


def test_synthetic_ratings_have_user_groups_with_equal_ratings():
    matrix, attributes, groups = ratings.synthetic(np.random.default_rng(3), 9, 15, rank=3, num_groups=3)
    assert matrix.shape == (9, 15) and attributes.shape == (15, 3)
    assert matrix.min() >= 0.5 and matrix.max() <= 5.0
    np.testing.assert_array_equal(matrix[0], matrix[3])
    env = ratings.ratings_environment(matrix, attributes, dim=4, noise=0.5, labels=groups)
    assert env.arms.shape == (15, 4) and env.num_clusters == 3


def write_movielens(folder):
    folder.mkdir()
    # 3 movies: 10 is rated by all, 20 by users 1-3, 30 by users 1 and 4; user 5 rates only movie 40
    rows = [(1, 10, 4.0), (2, 10, 3.5), (3, 10, 2.0), (4, 10, 5.0), (5, 40, 1.0)]
    rows += [(1, 20, 3.0), (2, 20, 2.5), (3, 20, 1.0), (1, 30, 4.5), (4, 30, 4.0)]
    (folder / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n" + "".join(f"{u},{m},{r},0\n" for u, m, r in rows)
    )
    (folder / "movies.csv").write_text(
        "movieId,title,genres\n10,A,Comedy|Drama\n20,B,Drama\n30,C,Action\n40,D,(no genres listed)\n"
    )


def test_movielens_loader_keeps_the_most_rated_movies_and_their_most_active_users(tmp_path):
    write_movielens(tmp_path / "ml")
    matrix, attributes = ratings.movielens(tmp_path / "ml", num_users=3, num_items=2, rank=1)
    # movies 10 (4 ratings) and 20 (3); users 1, 2, 3 rated both; genres Comedy, Drama
    assert matrix.shape == (3, 2)
    np.testing.assert_allclose(matrix, [[4.0, 3.0], [3.5, 2.5], [2.0, 1.0]])
    np.testing.assert_array_equal(attributes, [[1, 1], [0, 1]])


def test_movielens_loader_fills_missing_ratings_and_names_missing_files(tmp_path):
    write_movielens(tmp_path / "ml")
    matrix, _ = ratings.movielens(tmp_path / "ml", num_users=4, num_items=3, rank=1)
    assert not np.isnan(matrix).any() and matrix[3, 0] == 5.0  # observed entries are kept
    with pytest.raises(ratings.RatingsNotFound, match=r"lacks movies.csv"):
        (tmp_path / "ml" / "movies.csv").unlink()
        ratings.movielens(tmp_path / "ml", 3, 2, 1)

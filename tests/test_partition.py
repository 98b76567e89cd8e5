import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taciturn.data.partition import PartitionError, class_histogram, partition

LABELS = np.random.default_rng(0).integers(0, 10, size=3000)


def assert_exact_cover(parts, n):
    joined = np.concatenate(parts)
    assert len(joined) == n
    assert np.array_equal(np.sort(joined), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["iid", "dirichlet", "shards", "one_class"]),
    num_clients=st.integers(10, 60),
    alpha=st.floats(0.1, 100.0),
    k=st.integers(1, 10),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_sample_exactly_once_and_reproducible(kind, num_clients, alpha, k, seed):
    options = {"dirichlet": {"alpha": alpha, "min_size": 5}, "shards": {"classes_per_client": k}}.get(
        kind, {}
    )
    parts = partition(LABELS, kind, num_clients, np.random.default_rng(seed), **options)
    assert len(parts) == num_clients
    assert_exact_cover(parts, len(LABELS))
    again = partition(LABELS, kind, num_clients, np.random.default_rng(seed), **options)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_different_seeds_give_different_partitions():
    a = partition(LABELS, "dirichlet", 20, np.random.default_rng(1), alpha=0.5)
    b = partition(LABELS, "dirichlet", 20, np.random.default_rng(2), alpha=0.5)
    assert any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_dirichlet_with_large_alpha_is_close_to_iid():
    global_share = np.bincount(LABELS, minlength=10) / len(LABELS)

    def mean_deviation(parts):
        hist = class_histogram(LABELS, parts, 10)
        shares = hist / hist.sum(axis=1, keepdims=True)
        return np.abs(shares - global_share).sum(axis=1).mean()  # mean total-variation x 2

    rng = np.random.default_rng(0)
    iid = mean_deviation(partition(LABELS, "iid", 10, rng))
    wide = mean_deviation(partition(LABELS, "dirichlet", 10, rng, alpha=1e4))
    skewed = mean_deviation(partition(LABELS, "dirichlet", 10, rng, alpha=0.1))
    assert wide < 2 * iid + 0.02
    assert skewed > 5 * wide


def test_dirichlet_respects_min_size():
    parts = partition(LABELS, "dirichlet", 50, np.random.default_rng(0), alpha=0.3, min_size=20)
    assert min(len(p) for p in parts) >= 20


def test_shards_give_exactly_k_classes():
    parts = partition(LABELS, "shards", 25, np.random.default_rng(0), classes_per_client=2)
    hist = class_histogram(LABELS, parts, 10)
    assert ((hist > 0).sum(axis=1) == 2).all()


def test_one_class_gives_client_i_class_i_mod_c():
    parts = partition(LABELS, "one_class", 20, np.random.default_rng(0))
    for client, p in enumerate(parts):
        assert set(LABELS[p]) == {client % 10}
    sizes_of_class_3 = [len(parts[3]), len(parts[13])]
    assert abs(sizes_of_class_3[0] - sizes_of_class_3[1]) <= 1


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in partition(LABELS, "iid", 7, np.random.default_rng(0))]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    ("kind", "clients", "options", "match"),
    [
        ("one_class", 5, {}, "at least one client per class"),
        ("shards", 3, {"classes_per_client": 2}, "cannot cover"),
        ("dirichlet", 10, {"alpha": 0.5, "min_size": 400}, "min_size"),
        ("dirichlet", 100, {"alpha": 0.001, "min_size": 25}, "raise partition.alpha"),
        ("stripes", 10, {}, "unknown partition"),
    ],
)
def test_impossible_partitions_say_what_to_change(kind, clients, options, match):
    with pytest.raises(PartitionError, match=match):
        partition(LABELS, kind, clients, np.random.default_rng(0), **options)

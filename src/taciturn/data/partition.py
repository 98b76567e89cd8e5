"""Partitioners: split a labelled dataset over clients.

Every partitioner is a pure function of (labels, number of clients, its options, a seeded
generator), returns one index array per client, and assigns every sample to exactly one client.
"""

from __future__ import annotations

import numpy as np

from taciturn.core.errors import TaciturnError

MAX_DIRICHLET_TRIES = 1000


class PartitionError(TaciturnError, ValueError):
    """The requested partition cannot be built (the message says which option to change)."""


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle, then cut into ``num_clients`` parts whose sizes differ by at most one."""
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


def dirichlet(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: float, min_size: int = 10
) -> list[np.ndarray]:
    """Label-skew split of Hsu et al. 2019 / NIID-Bench (Li et al. 2022).

    For each class c, proportions p_c ~ Dir(alpha * 1_N) cut that class's shuffled samples over the
    N clients; the whole draw is repeated until every client holds at least ``min_size`` samples.
    Small alpha gives each client few classes; alpha -> infinity approaches the IID split.
    """
    classes = np.unique(labels)
    if min_size * num_clients > len(labels):
        raise PartitionError(
            f"min_size={min_size} for {num_clients} clients needs {min_size * num_clients} samples, "
            f"the dataset has {len(labels)}; lower partition.min_size or partition.num_clients"
        )
    by_class = [np.flatnonzero(labels == c) for c in classes]
    for _ in range(MAX_DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for members in by_class:
            shuffled = rng.permutation(members)
            cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, alpha)))[:-1] * len(shuffled)).astype(int)
            for client, piece in enumerate(np.split(shuffled, cuts)):
                parts[client].append(piece)
        result = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(r) for r in result) >= min_size:
            return result
    raise PartitionError(
        f"Dirichlet(alpha={alpha}) gave some client fewer than min_size={min_size} samples in "
        f"{MAX_DIRICHLET_TRIES} draws; raise partition.alpha or lower partition.min_size"
    )


def _split_classes(
    labels: np.ndarray, owners: list[list[int]], num_clients: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Give each class's shuffled samples to its owners in near-equal pieces."""
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, clients in enumerate(owners):
        members = rng.permutation(np.flatnonzero(labels == c))
        for client, piece in zip(clients, np.array_split(members, len(clients)), strict=True):
            parts[client].append(piece)
    return [np.sort(np.concatenate(p)) if p else np.empty(0, np.int64) for p in parts]


def shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, classes_per_client: int
) -> list[np.ndarray]:
    """Pathological non-IID split (McMahan et al. 2017): every client holds exactly k classes.

    Classes are laid on a ring in a seeded random order and client i takes the k consecutive
    classes starting at i*k; each class is then shared equally among the clients that hold it.
    Covering every sample needs num_clients * k >= number of classes.
    """
    num_classes = int(labels.max()) + 1
    k = classes_per_client
    if not 1 <= k <= num_classes:
        raise PartitionError(f"classes_per_client must lie in [1, {num_classes}], got {k}")
    if num_clients * k < num_classes:
        raise PartitionError(
            f"{num_clients} clients x {k} classes cannot cover {num_classes} classes; "
            "raise partition.classes_per_client or partition.num_clients"
        )
    ring = rng.permutation(num_classes)
    owners: list[list[int]] = [[] for _ in range(num_classes)]
    for client in range(num_clients):
        for j in range(k):
            owners[ring[(client * k + j) % num_classes]].append(client)
    return _split_classes(labels, owners, num_clients, rng)


def one_class(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Client i holds only class (i mod C); a class held by several clients is split equally."""
    num_classes = int(labels.max()) + 1
    if num_clients < num_classes:
        raise PartitionError(
            f"one_class needs at least one client per class ({num_classes}), got {num_clients}; "
            "raise partition.num_clients or use shards with classes_per_client > 1"
        )
    owners = [list(range(c, num_clients, num_classes)) for c in range(num_classes)]
    return _split_classes(labels, owners, num_clients, rng)


def natural(groups: np.ndarray | None) -> list[np.ndarray]:
    """One client per distinct value of ``groups`` (a user, writer or task id per sample), in sorted
    order of the values: the partition real cross-device data comes with. No randomness is needed.

    flwr-datasets' NaturalIdPartitioner numbers the clients the same way (sorted ids) but only for
    Hugging Face datasets, not tensors, and its 0.6.1 requires datasets>=4,<5: installing it beside
    the hf extra downgrades datasets 5.2.0 -> 4.8.5 and huggingface_hub 2.4.0 -> 1.33.0 (checked
    with pip install --dry-run -c constraints.txt flwr-datasets), so it is not used."""
    if groups is None:
        raise PartitionError(
            "partition.kind = 'natural' needs a client id per sample: data.dataset = 'hf' with "
            "partition.column, or taciturn.data.from_tensors(..., groups=...) / from_hf(..., groups=...)"
        )
    _, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    return np.split(order, np.cumsum(np.bincount(inverse))[:-1])


def partition(
    labels: np.ndarray,
    kind: str,
    num_clients: int | None,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
    **options,
) -> list[np.ndarray]:
    """``groups``: a client id per sample, for the natural partition (which ignores ``num_clients``)."""
    if kind == "natural":
        return natural(groups)
    if num_clients < 1:
        raise PartitionError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients > len(labels):
        raise PartitionError(f"{num_clients} clients cannot share {len(labels)} samples")
    functions = {"iid": iid, "dirichlet": dirichlet, "shards": shards, "one_class": one_class}
    if kind not in functions:
        raise PartitionError(f"unknown partition {kind!r}; choose one of {', '.join(functions)}")
    return functions[kind](labels, num_clients, rng, **options)


def class_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """(clients x classes) sample counts."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])

"""Datasets, partitioners and the federated view of a dataset (one tensor, index arrays per client)."""

from taciturn.data.datasets import ArrayDataset, DatasetNotFound, load_dataset
from taciturn.data.federated import FederatedData
from taciturn.data.partition import partition
from taciturn.data.user import from_hf, from_tensors, from_torch

__all__ = [
    "ArrayDataset",
    "DatasetNotFound",
    "FederatedData",
    "from_hf",
    "from_tensors",
    "from_torch",
    "load_dataset",
    "partition",
]

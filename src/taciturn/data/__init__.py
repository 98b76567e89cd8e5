"""Datasets, partitioners and the federated view of a dataset (one tensor, index arrays per client)."""

from taciturn.data.datasets import ArrayDataset, DatasetNotFound, load_dataset
from taciturn.data.federated import FederatedData
from taciturn.data.partition import partition

__all__ = ["ArrayDataset", "DatasetNotFound", "FederatedData", "load_dataset", "partition"]

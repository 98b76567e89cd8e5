"""Federated algorithms, one file each, in the shape defined in ``base``."""

from taciturn.algorithms.base import Algorithm, AlgorithmConfig
from taciturn.algorithms.fedavg import FedAvg

REGISTRY: dict[str, type[Algorithm]] = {cls.name: cls for cls in (FedAvg,)}


def build_algorithm(config: AlgorithmConfig) -> Algorithm:
    return REGISTRY[config.name](config)


__all__ = ["REGISTRY", "Algorithm", "AlgorithmConfig", "FedAvg", "build_algorithm"]

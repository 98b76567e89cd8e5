"""Federated algorithms, one file each, in the shape defined in ``base``."""

from taciturn.algorithms.base import Algorithm, AlgorithmConfig
from taciturn.algorithms.fedavg import FedAvg
from taciturn.algorithms.fedkseed import FedKSeed
from taciturn.algorithms.ferret import Ferret

REGISTRY: dict[str, type[Algorithm]] = {cls.name: cls for cls in (FedAvg, Ferret, FedKSeed)}


def build_algorithm(config: AlgorithmConfig) -> Algorithm:
    return REGISTRY[config.name](config)


__all__ = ["REGISTRY", "Algorithm", "AlgorithmConfig", "FedAvg", "FedKSeed", "Ferret", "build_algorithm"]

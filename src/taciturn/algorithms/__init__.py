"""Federated algorithms, one file each, in the shape defined in ``base``."""

from taciturn.algorithms.base import Algorithm, AlgorithmConfig
from taciturn.algorithms.event_admm import EventADMM
from taciturn.algorithms.fedadmm import FedADMM
from taciturn.algorithms.fedavg import FedAvg
from taciturn.algorithms.fedkseed import FedKSeed
from taciturn.algorithms.fedprox import FedProx
from taciturn.algorithms.ferret import Ferret
from taciturn.algorithms.scaffold import Scaffold

REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (FedAvg, FedProx, Scaffold, FedADMM, EventADMM, Ferret, FedKSeed)
}


def build_algorithm(config: AlgorithmConfig) -> Algorithm:
    return REGISTRY[config.name](config)


__all__ = [
    "REGISTRY",
    "Algorithm",
    "AlgorithmConfig",
    "EventADMM",
    "FedADMM",
    "FedAvg",
    "FedKSeed",
    "FedProx",
    "Ferret",
    "Scaffold",
    "build_algorithm",
]

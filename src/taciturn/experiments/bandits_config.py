"""The config of a multi-agent bandit run (``type = "bandits"``), validated before any work starts.

One run simulates every listed method on ``repetitions`` independent runs of one environment
(seeds seed, seed + 1, ...), side by side, for ``horizon`` steps of one agent pulling one arm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from taciturn.algorithms.base import StrictModel
from taciturn.experiments.config import ChannelConfig, RunName

METHODS = ("bass", "independent", "pooled", "oracle", "club", "sclub", "dynucb")
Method = Literal["bass", "independent", "pooled", "oracle", "club", "sclub", "dynucb"]


class ClusteredEnvironment(StrictModel):
    """Gaussian arms, one Gaussian parameter per cluster; agent i is in cluster i mod num_clusters."""

    kind: Literal["clustered"] = "clustered"
    num_agents: int = Field(6, ge=1)
    num_arms: int = Field(10, ge=2)
    dim: int = Field(5, ge=1)
    num_clusters: int = Field(2, ge=1)
    noise: float = Field(1.0, ge=0, description="standard deviation of the Gaussian reward noise")

    def known_clusters(self) -> int | None:
        return min(self.num_clusters, self.num_agents)


class UnclusteredEnvironment(StrictModel):
    """theta_i = mu + spread * xi_i: related parameters, no two equal."""

    kind: Literal["unclustered"]
    num_agents: int = Field(6, ge=1)
    num_arms: int = Field(10, ge=2)
    dim: int = Field(5, ge=1)
    spread: float = Field(0.5, gt=0, description="scale of each agent's deviation from the common mean")
    noise: float = Field(1.0, ge=0)

    def known_clusters(self) -> int | None:
        return None


class RatingsEnvironment(StrictModel):
    """Users are agents, items are arms: MovieLens files at ``path``, synthetic low-rank ratings without."""

    kind: Literal["ratings"]
    num_agents: int = Field(20, ge=1, description="users")
    num_arms: int = Field(20, ge=2, description="items")
    dim: int = Field(5, ge=2, description="arm features: an intercept and dim - 1 principal components")
    path: Path | None = Field(None, description="folder with MovieLens ratings.csv and movies.csv")
    rank: int = Field(3, ge=1, description="rank of the synthetic ratings and of the completion")
    num_clusters: int = Field(3, ge=1, description="user groups of the synthetic ratings")
    noise: float = Field(0.5, ge=0)

    @model_validator(mode="after")
    def _groups_need_synthetic(self) -> RatingsEnvironment:
        if self.path is not None and "num_clusters" in self.model_fields_set:
            raise ValueError("num_clusters describes synthetic ratings; MovieLens users have no known groups")
        return self

    def known_clusters(self) -> int | None:
        return None if self.path is not None else min(self.num_clusters, self.num_agents)


EnvironmentConfig = Annotated[
    ClusteredEnvironment | UnclusteredEnvironment | RatingsEnvironment, Field(discriminator="kind")
]


class LinUcbConfig(StrictModel):
    """The optimistic arm choice every method shares, and the confidence radius (bandits/linucb.py)."""

    alpha: float = Field(0.25, gt=0, description="scale of the confidence radius in the bonus (1 = theory)")
    lam: float = Field(1.0, gt=0, description="ridge regularisation")
    delta: float = Field(0.01, gt=0, lt=1, description="confidence level of the radius")
    noise_bound: float | None = Field(None, ge=0, description="R; default: the environment's noise")
    norm_bound: float | None = Field(None, gt=0, description="S; default: each run's own largest ||theta_i||")


class BassConfig(StrictModel):
    test: Literal["mahalanobis", "ellipsoid_overlap", "ellipsoid_overlap_bandpy"] = Field(
        "mahalanobis",
        description="bias-vs-uncertainty test, ellipsoid overlap (radius beta), or bandpy LBC's (sqrt(beta))",
    )
    scale: float = Field(
        0.35, gt=0, description="scale of the confidence radius in the test (1 = theory: level delta)"
    )


class ClubConfig(StrictModel):
    gamma: float = Field(1.0, gt=0, description="scale of CLUB's edge-deletion threshold")


class SclubConfig(StrictModel):
    alpha: float = Field(1.0, gt=0, description="scale of SCLUB's split and merge thresholds")


class DynUcbConfig(StrictModel):
    num_clusters: int | None = Field(None, ge=1, description="default: the environment's number of clusters")


class BanditsCheckpoint(StrictModel):
    every: int = Field(10, ge=1, description="write a checkpoint every k records (and after the last)")
    keep: int = Field(2, ge=1)


class BanditsConfig(StrictModel):
    type: Literal["bandits"]
    name: RunName = "bandits"
    seed: int = Field(0, ge=0)
    repetitions: int = Field(5, ge=1, description="independent runs, with seeds seed, seed + 1, ...")
    horizon: int = Field(5000, ge=1, description="steps; at each one agent, drawn at random, pulls an arm")
    record_every: int = Field(100, ge=1, description="steps between two records of the metrics")
    environment: EnvironmentConfig = ClusteredEnvironment()
    methods: tuple[Method, ...] = METHODS
    linucb: LinUcbConfig = LinUcbConfig()
    bass: BassConfig = BassConfig()
    club: ClubConfig = ClubConfig()
    sclub: SclubConfig = SclubConfig()
    dynucb: DynUcbConfig = DynUcbConfig()
    channel: ChannelConfig = ChannelConfig()
    checkpoint: BanditsCheckpoint = BanditsCheckpoint()

    @model_validator(mode="before")
    @classmethod
    def _default_kind(cls, tree: Any) -> Any:
        """[environment] may omit its kind: fill the default so errors stay about real keys."""
        if (
            isinstance(tree, dict)
            and isinstance(tree.get("environment"), dict)
            and "kind" not in tree["environment"]
        ):
            tree = {**tree, "environment": {"kind": "clustered", **tree["environment"]}}
        return tree

    @model_validator(mode="after")
    def _methods_fit_environment(self) -> BanditsConfig:
        if not self.methods:
            raise ValueError(f"methods is empty; list some of {', '.join(METHODS)}")
        repeated = sorted({m for m in self.methods if self.methods.count(m) > 1})
        if repeated:
            raise ValueError(f"methods lists {', '.join(repeated)} more than once")
        if (
            "oracle" in self.methods
            and isinstance(self.environment, RatingsEnvironment)
            and self.environment.path
        ):
            raise ValueError(
                "oracle needs the true clusters, which MovieLens users do not have; remove 'oracle'"
            )
        if "dynucb" in self.methods and self.dynucb_clusters is None:
            raise ValueError(
                f"dynucb needs a number of clusters and a {self.environment.kind} environment has none: "
                "set [dynucb] num_clusters"
            )
        return self

    @property
    def dynucb_clusters(self) -> int | None:
        return self.dynucb.num_clusters or self.environment.known_clusters()

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.repetitions))

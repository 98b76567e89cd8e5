"""The run configuration: a TOML file validated (pydantic) before any work starts.

Unknown keys are rejected with a did-you-mean, types and ranges are checked, and every error
names the key and the file. ``--set key=value`` overrides are applied before validation.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import types
import typing
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import tomli_w
from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator, model_validator

from taciturn.algorithms import REGISTRY
from taciturn.algorithms.base import StrictModel
from taciturn.attacks.config import AttackConfig
from taciturn.compression.config import CompressionConfig
from taciturn.core.errors import TaciturnError
from taciturn.engine.analysis import AnalysisConfig
from taciturn.engine.trust import TrustConfig
from taciturn.experiments.tracking import TrackingConfig
from taciturn.privacy.config import PrivacyConfig
from taciturn.secagg.config import SecAggConfig
from taciturn.server.config import AggregationConfig
from taciturn.tasks.layers import BIAS_VAR, WEIGHT_VAR


class ConfigError(TaciturnError, ValueError):
    """A configuration that cannot run; the message names the file, the key and the fix."""


def _safe_name(name: str) -> str:
    """A run name becomes a folder name (runs/<name>): one plain path component, printable."""
    if name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"name {name!r} must be a plain folder name (no '/', '\\', '.' or '..')")
    if any(unicodedata.category(c).startswith("C") for c in name):
        raise ValueError(f"name {name!r} contains control or invisible characters; use printable ones")
    if name != name.strip():
        raise ValueError(f"name {name!r} starts or ends with white space")
    return name


RunName = Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_safe_name)]

# Upper bounds that catch typos (10**12 steps) before any work starts; memory is checked in the runner.
MAX_ROUNDS = 10_000_000
MAX_WORKERS = 4096


# ----- data -----
class SubsetOptions(StrictModel):
    """A smaller problem cut from a dataset (data/subset.py)."""

    classes: tuple[Annotated[int, Field(ge=0)], ...] | None = Field(
        None, description="keep only these classes, relabelled 0, 1, ... in this order"
    )
    train_size: int | None = Field(None, ge=1, description="stratified random sample of the training set")
    test_size: int | None = Field(None, ge=1, description="stratified random sample of the test set")


class FashionMnistData(SubsetOptions):
    dataset: Literal["fashion_mnist"] = "fashion_mnist"
    path: Path | None = Field(None, description="folder with the four IDX .gz files (optional)")


class DigitsData(SubsetOptions):
    dataset: Literal["digits"]


class SyntheticData(StrictModel):
    dataset: Literal["synthetic"]
    num_samples: int = Field(2000, ge=10, description="checked against memory before generating")
    num_features: int = Field(20, ge=1)
    num_classes: int = Field(4, ge=2)
    separation: float = Field(2.0, gt=0, le=1e6)

    @model_validator(mode="after")
    def _classes_have_samples(self) -> SyntheticData:
        if self.num_classes > self.num_samples:
            raise ValueError(
                f"num_classes = {self.num_classes:,} is more than num_samples = {self.num_samples:,}: most "
                "classes would have no sample; use fewer classes or more samples"
            )
        return self


class InstructionData(StrictModel):
    """Instruction-tuning data for causal language models (data/instructions.py)."""

    dataset: Literal["instructions"]
    source: Literal["synthetic", "natural_instructions", "dolly"] = "synthetic"
    path: Path | None = Field(
        None, description="natural_instructions: the tasks/ folder; dolly: databricks-dolly-15k.jsonl"
    )
    split_by: Literal["task", "category"] = Field(
        "task",
        description="task: NI-style (partition one_class = one task per client); category: Dolly-style",
    )
    heldout: int | tuple[str, ...] = Field(
        4, description="how many tasks/categories to hold out for evaluation (seeded), or their names"
    )
    examples_per_task: int = Field(64, ge=1, description="synthetic: generated per task; NI: kept per task")
    test_examples: int = Field(64, ge=1, description="held-out examples evaluated (Rouge-L)")

    @model_validator(mode="after")
    def _path_for_real_data(self) -> InstructionData:
        if self.source != "synthetic" and self.path is None:
            raise ValueError(f"data.source = '{self.source}' reads local files: set data.path")
        return self


IMPORT_PATH = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"  # "package.module:callable"


class FactoryData(StrictModel):
    """Your own data from a function named by its import path (taciturn.data.user.as_dataset reads
    what it returns: four tensors, a (train, test) pair of torch or Hugging Face datasets, or a
    Hugging Face DatasetDict with "train" and "test")."""

    dataset: Literal["factory"]
    factory: str = Field(pattern=IMPORT_PATH, description="package.module:callable")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the factory")


class HfData(StrictModel):
    """A Hugging Face dataset from local files (data/hf.py): a ``save_to_disk`` folder, or json,
    csv or parquet files through ``datasets.load_dataset``. A text column is tokenized with the
    tokenizer of an ``hf`` model; without "test" a seeded 10% of "train" is held out."""

    dataset: Literal["hf"]
    format: Literal["disk", "json", "csv", "parquet"] = "disk"
    path: Path | None = Field(None, description="disk: the folder written by DatasetDict.save_to_disk")
    data_files: dict[str, str] | None = Field(
        None, description='json/csv/parquet: {"train" = ..., "test" = ...}'
    )
    text: str = Field("text", description="the text column, tokenized by the hf model's tokenizer")
    input: str | None = Field(None, description="a numeric input column instead of text")
    label: str = Field("label", description="the class label column")

    @model_validator(mode="after")
    def _where(self) -> HfData:
        if self.format == "disk" and self.path is None:
            raise ValueError("data.format = 'disk' reads a save_to_disk folder: set data.path")
        if self.format != "disk" and not (self.data_files and "train" in self.data_files):
            raise ValueError(
                f"data.format = '{self.format}' reads files: set data.data_files = {{ train = ... }}"
            )
        return self


class ClientsData(StrictModel):
    """Data that comes per client (data/clients.py): each client's own records, none partitioned by
    the run seed. In a deployment each node reads its own clients' data (its ``--node-config``
    ``data.path`` or ``data.factory``) and the server reads none of it."""

    dataset: Literal["clients"]
    path: Path | None = Field(
        None, description="a folder of .npz files, one per client (sorted by name), or one .npz file"
    )
    factory: str | None = Field(
        None, pattern=IMPORT_PATH, description="package.module:callable returning one item per client"
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the factory")
    test: Path | None = Field(
        None,
        description="the server's own held-out set (.npz: x_test, y_test); without it the clients "
        "evaluate the global model on their own held-out splits (federated evaluation)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ClientsData:
        if (self.path is None) == (self.factory is None):
            raise ValueError(
                "data.dataset = 'clients' reads data.path (per-client .npz files) or data.factory "
                "(one item per client): give exactly one"
            )
        if self.kwargs and self.factory is None:
            raise ValueError("data.kwargs go with data.factory")
        return self


class PythonData(StrictModel):
    """Data handed to ``taciturn.run(data=...)`` as a Python object; resuming needs it again."""

    dataset: Literal["python"]
    name: str = Field("data", description="what it was (shown in the report)")


DataConfig = Annotated[
    FashionMnistData
    | DigitsData
    | SyntheticData
    | InstructionData
    | FactoryData
    | HfData
    | ClientsData
    | PythonData,
    Field(discriminator="dataset"),
]


# ----- partition -----
class IidPartition(StrictModel):
    kind: Literal["iid"]
    num_clients: int = Field(100, ge=1)


class DirichletPartition(StrictModel):
    kind: Literal["dirichlet"] = "dirichlet"
    num_clients: int = Field(100, ge=1)
    alpha: float = Field(0.5, gt=0)
    min_size: int = Field(10, ge=1)


class ShardsPartition(StrictModel):
    kind: Literal["shards"]
    num_clients: int = Field(100, ge=1)
    classes_per_client: int = Field(2, ge=1)


class OneClassPartition(StrictModel):
    kind: Literal["one_class"]
    num_clients: int = Field(10, ge=1)


class NaturalPartition(StrictModel):
    """One client per value of a data column (user, writer, task id): data as it comes from devices."""

    kind: Literal["natural"]
    column: str = Field(description="the column (HF datasets) whose values name the clients")

    @property
    def num_clients(self) -> None:
        return None  # as many as the column has values


class GivenPartition(StrictModel):
    """Each client's data as it came (data.dataset = 'clients'): nothing is split by the run seed."""

    kind: Literal["given"]

    @property
    def num_clients(self) -> None:
        return None  # as many as the data has clients


PartitionConfig = Annotated[
    IidPartition
    | DirichletPartition
    | ShardsPartition
    | OneClassPartition
    | NaturalPartition
    | GivenPartition,
    Field(discriminator="kind"),
]


# ----- model -----
class ParameterizationOptions(StrictModel):
    """How every layer is parameterised and initialised (tasks/layers.py)."""

    parameterization: Literal["pytorch", "standard", "ntk"] = Field(
        "pytorch",
        description="pytorch: default init; standard: N(0, weight_var/fan_in) weights; "
        "ntk: N(0, 1) weights scaled by sqrt(weight_var/fan_in) in the forward pass",
    )
    weight_var: float | None = Field(None, gt=0, description="sigma_w^2 (standard and ntk; default 1.5)")
    bias_var: float | None = Field(None, ge=0, description="sigma_b^2 (standard and ntk; default 0.01)")

    @model_validator(mode="before")
    @classmethod
    def _default_variances(cls, tree: Any) -> Any:
        """The Gaussian parameterisations get Jian & Liu's variances unless told otherwise."""
        if isinstance(tree, dict) and tree.get("parameterization") in ("standard", "ntk"):
            return {"weight_var": WEIGHT_VAR, "bias_var": BIAS_VAR, **tree}
        return tree

    @model_validator(mode="after")
    def _variances_need_a_gaussian_init(self) -> ParameterizationOptions:
        given = [k for k in ("weight_var", "bias_var") if getattr(self, k) is not None]
        if given and self.parameterization == "pytorch":
            raise ValueError(
                f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} only with "
                "parameterization = 'standard' or 'ntk' (the default 'pytorch' uses PyTorch's own "
                "initialisation)"
            )
        return self


class LogRegModel(ParameterizationOptions):
    kind: Literal["logreg"]


class MlpModel(ParameterizationOptions):
    kind: Literal["mlp"] = "mlp"
    hidden: tuple[Annotated[int, Field(ge=1)], ...] = (200,)


class CnnModel(ParameterizationOptions):
    kind: Literal["cnn"]
    padding: Literal["same", "valid"] = "same"


class CausalLmModel(StrictModel):
    """A causal language model: a tiny random Llama/GPT-2 over bytes, a GGUF checkpoint, or a
    Hugging Face model folder (save_pretrained: AutoModelForCausalLM and its tokenizer)."""

    kind: Literal["causal_lm"]
    source: Literal["tiny", "gguf", "hf"] = "tiny"
    path: Path | None = Field(
        None, description="gguf: the .gguf file (default: SmolLM2-135M-Instruct); hf: the model folder"
    )
    architecture: Literal["llama", "gpt2"] = "llama"
    hidden: int = Field(64, ge=1, description="tiny: width")
    layers: int = Field(2, ge=1, description="tiny: transformer blocks")
    heads: int = Field(4, ge=1, description="tiny: attention heads (must divide hidden)")
    max_length: int = Field(128, ge=8, description="tokens per training example (prompt + response)")
    max_new_tokens: int = Field(32, ge=1, description="greedy generation length at evaluation")

    @model_validator(mode="after")
    def _hf_needs_a_path(self) -> CausalLmModel:
        if self.source == "hf" and self.path is None:
            raise ValueError("model.source = 'hf' reads a save_pretrained folder: set model.path")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> CausalLmModel:
        if self.hidden % self.heads:
            raise ValueError(f"model.heads = {self.heads} must divide model.hidden = {self.hidden}")
        if self.max_new_tokens >= self.max_length:
            raise ValueError("model.max_new_tokens must be smaller than model.max_length")
        return self


class LenetModel(ParameterizationOptions):
    kind: Literal["lenet"]
    width: int = Field(1, ge=1, description="k: conv 6k, 16k; fc 120k, 84k (Jian & Liu's CNN_k)")


class HfModel(StrictModel):
    """A Hugging Face sequence classifier (AutoModelForSequenceClassification and its tokenizer)."""

    kind: Literal["hf"]
    name_or_path: str = Field(
        description="a folder written by save_pretrained (a hub id where there is internet)"
    )
    max_length: int = Field(128, ge=2, description="tokens per text (truncated or padded)")


class BufferOptions(StrictModel):
    buffers: Literal["federated", "local"] = Field(
        "federated",
        description="BatchNorm running statistics: averaged sample-weighted with the weights "
        "('federated'), or kept by each client and never sent ('local': FedBN, Li et al., ICLR 2021)",
    )


class FactoryModel(BufferOptions):
    """Your own nn.Module, built by a function named by its import path (called with a seeded
    global RNG, so the same seed starts from the same weights). Its weights are round 0's model."""

    kind: Literal["factory"]
    factory: str = Field(pattern=IMPORT_PATH, description="package.module:callable returning an nn.Module")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the factory")


class PythonModel(BufferOptions):
    """An nn.Module handed to ``taciturn.run(model=...)``; resuming needs it again."""

    kind: Literal["python"]
    name: str = Field("model", description="its class (shown in the report)")


ModelConfig = Annotated[
    LogRegModel | MlpModel | CnnModel | LenetModel | CausalLmModel | HfModel | FactoryModel | PythonModel,
    Field(discriminator="kind"),
]

BUILTIN_LOSSES = ("cross_entropy", "mse")

AlgorithmConfigs = Annotated[
    Union[tuple(cls.Config for cls in REGISTRY.values())],  # noqa: UP007 (built from the registry)
    Field(discriminator="name"),
]


class ChannelConfig(StrictModel):
    drop_up: float = Field(0.0, ge=0, le=1, description="probability an uplink message is lost")
    drop_down: float = Field(0.0, ge=0, le=1, description="probability a downlink message is lost")


CLIENT_HOLDOUT = 0.2  # [eval] client_holdout's default


class EvalConfig(StrictModel):
    every: int = Field(1, ge=1, description="evaluate the global model every k rounds (and after the last)")
    batch_size: int = Field(2000, ge=1)
    clients: float = Field(
        0.0,
        ge=0,
        le=1,
        description="the fraction of clients, sampled at each evaluation, that score the global model on "
        "their own held-out split (0: off)",
    )
    client_holdout: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="the share of each client's data held out for that (removed from its training data "
        "for the whole run; default 0.2 when clients > 0)",
    )

    @model_validator(mode="after")
    def _holdout_with_clients(self) -> EvalConfig:
        if self.clients == 0 and self.client_holdout is not None:
            raise ValueError("client_holdout applies only with eval.clients > 0 (client-side evaluation)")
        if self.clients > 0 and self.client_holdout is None:  # resolved, so config.toml says what was used
            object.__setattr__(self, "client_holdout", CLIENT_HOLDOUT)
        return self


def _known_direction(metric: str | None, mode: str | None) -> str | None:
    """``mode``, or the direction ``metric``'s name tells (best.direction), so config.toml says what
    was used; a name that tells nothing stays unresolved until its metrics column is known."""
    from taciturn.experiments.best import direction

    if metric is None:
        return mode
    try:
        return direction(metric, mode)
    except ValueError:
        return mode


class CheckpointConfig(StrictModel):
    every: int = Field(10, ge=1, description="write a checkpoint every k rounds (and after the last)")
    keep: int = Field(2, ge=1, description="how many recent checkpoints to keep")
    best: str | None = Field(
        None, min_length=1, description="keep the model with the best value of this metrics column in best/"
    )
    best_mode: Literal["min", "max"] | None = Field(
        None, description="whether lower or higher is better (default: losses min, accuracies max)"
    )

    @model_validator(mode="after")
    def _known_direction(self) -> CheckpointConfig:
        object.__setattr__(self, "best_mode", _known_direction(self.best, self.best_mode))
        return self


class StopConfig(StrictModel):
    """Early stopping: end the run when ``metric`` has not improved for ``patience`` evaluations."""

    metric: str | None = Field(None, min_length=1, description="the metrics column to watch (unset: off)")
    mode: Literal["min", "max"] | None = Field(None, description="default: losses min, accuracies max")
    patience: int = Field(5, ge=1, description="evaluations (eval.every rounds apart) without improvement")
    min_delta: float = Field(0.0, ge=0, description="an improvement must beat the best by more than this")

    @model_validator(mode="after")
    def _known_direction(self) -> StopConfig:
        object.__setattr__(self, "mode", _known_direction(self.metric, self.mode))
        return self


_DEFAULT_TAGS = (
    ("data", "dataset", "fashion_mnist"),
    ("partition", "kind", "dirichlet"),
    ("model", "kind", "mlp"),
    ("algorithm", "name", "fedavg"),
)


class EngineConfig(StrictModel):
    executor: Literal["auto", "sequential", "vectorized", "parallel", "parallel_vectorized", "ray"] = Field(
        "auto",
        description="where clients run (parallel_vectorized: each worker process trains its share at once; "
        "ray: actors on a Ray cluster); auto measures this machine (engine/choice.py)",
    )
    workers: int = Field(
        0,
        ge=0,
        le=MAX_WORKERS,
        description="parallel workers (0: one per CPU core) or Ray actors (0: as the cluster allows)",
    )
    ray_address: str | None = Field(
        None, description="Ray cluster to join ('auto': the one on this machine); unset: start a local Ray"
    )
    ray_cpus_per_worker: float = Field(1.0, gt=0, description="CPUs each Ray worker actor reserves")
    ray_gpus_per_worker: float = Field(0.0, ge=0, description="GPUs each Ray worker actor reserves")
    store: Literal["auto", "memory", "disk"] = Field(
        "auto", description="client state: auto = disk for parallel workers or 1,000+ stateful clients"
    )
    threads: int = Field(0, ge=0, description="PyTorch threads in the main process (0: PyTorch's default)")
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$",
        description="where the model, data and local steps live: auto (a GPU when there is one), cpu, cuda, "
        "cuda:N, mps",
    )

    @model_validator(mode="after")
    def _ray_settings_need_ray(self) -> EngineConfig:
        fields = type(self).model_fields
        stray = [f for f in fields if f.startswith("ray_") and getattr(self, f) != fields[f].default]
        if stray and self.executor != "ray":
            raise ValueError(f"{', '.join(stray)} only apply to executor = 'ray' (it is '{self.executor}')")
        return self


class RunConfig(StrictModel):
    """A round-based federated run (FedAvg and the methods that share its shape)."""

    type: Literal["federated"] = "federated"
    name: RunName = "run"
    seed: int = Field(0, ge=0, lt=2**63)
    rounds: int = Field(50, ge=1, le=MAX_ROUNDS)
    loss: str = Field(
        "cross_entropy",
        description="cross_entropy; mse: squared error to one-hot targets (one 0/1 output for two classes); "
        "package.module:callable: your loss(outputs, targets); python: a function given to taciturn.run",
    )
    data: DataConfig = FashionMnistData()
    partition: PartitionConfig = DirichletPartition()
    model: ModelConfig = MlpModel()
    algorithm: AlgorithmConfigs = Field(default_factory=lambda: REGISTRY["fedavg"].Config())
    channel: ChannelConfig = ChannelConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    stop: StopConfig = StopConfig()
    tracking: TrackingConfig = TrackingConfig()
    engine: EngineConfig = EngineConfig()
    analysis: AnalysisConfig = AnalysisConfig()
    server: TrustConfig = TrustConfig()
    aggregation: AggregationConfig = AggregationConfig()
    attack: AttackConfig = AttackConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    secagg: SecAggConfig = SecAggConfig()
    compression: CompressionConfig = CompressionConfig()

    @model_validator(mode="before")
    @classmethod
    def _default_tags(cls, tree: Any) -> Any:
        """Tables may omit their kind: fill the default so the error messages stay about real keys.
        A table with a ``factory`` key is a plugin (model.factory = "pkg.mod:fn")."""
        if isinstance(tree, dict):
            data = tree.get("data")
            if isinstance(data, dict) and data.get("dataset") == "clients" and "partition" not in tree:
                tree = {**tree, "partition": {"kind": "given"}}  # per-client data comes split
            for table, tag in (("data", "dataset"), ("model", "kind")):
                if isinstance(tree.get(table), dict) and "factory" in tree[table] and tag not in tree[table]:
                    tree = {**tree, table: {tag: "factory", **tree[table]}}
            for table, tag, default in _DEFAULT_TAGS:
                if isinstance(tree.get(table), dict) and tag not in tree[table]:
                    tree = {**tree, table: {tag: default, **tree[table]}}
        return tree

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, value: str) -> str:
        if value in (*BUILTIN_LOSSES, "python") or re.match(IMPORT_PATH, value):
            return value
        close = difflib.get_close_matches(value, BUILTIN_LOSSES, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "or your own as 'package.module:callable'"
        raise ValueError(f"unknown loss {value!r}: choose {' or '.join(BUILTIN_LOSSES)}, {hint}")

    @model_validator(mode="after")
    def _model_fits_data(self) -> RunConfig:
        if self.model.kind in ("cnn", "lenet") and self.data.dataset == "synthetic":
            raise ValueError(
                f"model.kind = '{self.model.kind}' needs image data; use mlp or logreg with synthetic data"
            )
        text = self.data.dataset == "hf" and self.data.input is None
        if text and self.model.kind != "hf":
            raise ValueError(
                "data.text needs model.kind = 'hf' (its tokenizer); or set data.input to a numeric column"
            )
        if self.model.kind == "hf" and not text:
            raise ValueError(
                "model.kind = 'hf' classifies text: use data.dataset = 'hf' with a data.text column"
            )
        if (self.partition.kind == "given") != (self.data.dataset == "clients"):
            raise ValueError(
                "data.dataset = 'clients' comes split per client: it goes with partition.kind = 'given' "
                "(the default for it), and only with it"
            )
        if self.data.dataset == "clients" and self.model.kind in ("hf", "causal_lm"):
            raise ValueError(
                f"data.dataset = 'clients' holds arrays; model.kind = '{self.model.kind}' needs text"
            )
        if self.partition.kind == "natural" and self.data.dataset not in ("hf", "factory", "python"):
            raise ValueError(
                "partition.kind = 'natural' needs data with a client column: data.dataset = 'hf'"
            )
        if (self.model.kind == "causal_lm") != (self.data.dataset == "instructions"):
            raise ValueError("model.kind = 'causal_lm' and data.dataset = 'instructions' go together")
        if self.eval.clients and self.model.kind == "causal_lm":
            raise ValueError(
                "eval.clients: client-side evaluation scores class labels and your metrics, not the "
                "language-model task's generations; leave it at 0 with model.kind = 'causal_lm'"
            )
        if self.eval.clients and self.data.dataset == "clients":
            raise ValueError(
                "eval.clients carves a held-out split out of each partition's training data; "
                "data.dataset = 'clients' brings each client's own held-out split, on which the run "
                "already evaluates when there is no data.test (federated evaluation): leave "
                "eval.clients at 0"
            )
        if self.eval.clients and (self.privacy.enabled or self.secagg.enabled):
            table = "[privacy]" if self.privacy.enabled else "[secagg]"
            raise ValueError(
                f"eval.clients with {table}: client-side evaluation writes each sampled client's exact "
                "score on its own data into metrics.jsonl, which the mechanism does not cover; leave "
                "eval.clients at 0 in a private run"
            )
        if self.analysis.enabled and self.engine.executor.startswith(("parallel", "ray")):
            raise ValueError(
                "[analysis] needs every client's update in this process; use engine.executor = "
                "'sequential', 'vectorized' or 'auto' (parallel and Ray workers send back only their "
                "reduced share)"
            )
        return self

    @model_validator(mode="after")
    def _colluding_attackers_in_one_process(self) -> RunConfig:
        if self.attack.colluding and self.engine.executor.startswith("parallel"):
            raise ValueError(
                f"attack.kind = '{self.attack.kind}': the attackers read every honest update of the round; "
                "use engine.executor = 'sequential', 'vectorized' or 'auto'"
            )
        if self.attack.kind == "label_flip" and self.data.dataset == "instructions":
            raise ValueError("attack.kind = 'label_flip' needs a classification dataset")
        return self

    @model_validator(mode="after")
    def _secagg_fits(self) -> RunConfig:
        if not self.secagg.enabled:
            return self
        algorithm = REGISTRY[self.algorithm.name]
        if algorithm.delta_prefix != "" or algorithm.keeps_client_state:
            raise ValueError(
                "[secagg] sums model deltas of stateless clients with equal weights: use "
                "algorithm.name = 'fedavg' or 'fedprox'"
            )
        if self.engine.executor.startswith("parallel"):
            raise ValueError("[secagg] runs the protocol among all of a round's clients in one process")
        if self.aggregation != AggregationConfig() or (
            self.privacy.enabled and self.privacy.mode == "central"
        ):
            raise ValueError(
                "[secagg] hides every single update: the server can only sum them (no [aggregation] "
                "rules, no central [privacy]; local DP works)"
            )
        return self

    @model_validator(mode="after")
    def _privacy_fits(self) -> RunConfig:
        if not self.privacy.enabled:
            return self
        if self.privacy.mode == "central" and self.aggregation != AggregationConfig():
            raise ValueError(
                "[privacy] central DP clips to privacy.clip and adds noise to the plain sum; leave "
                "[aggregation] at its defaults (robust rules and adaptive clipping change the sensitivity)"
            )
        return self

    @model_validator(mode="after")
    def _mechanisms_cover_every_secret(self) -> RunConfig:
        """A privacy or robustness mechanism covers every array an algorithm sends about its data
        (``Algorithm.covers_secrets``), or the combination is refused here, before work."""
        if (self.aggregation.per_client or self.privacy.enabled) and not REGISTRY[
            self.algorithm.name
        ].covers_secrets():
            raise ValueError(
                f"[aggregation] and [privacy] must cover every array an algorithm sends; algorithm "
                f"'{self.algorithm.name}' sends arrays they cannot combine (use fedavg, fedprox or scaffold)"
            )
        return self

    @model_validator(mode="after")
    def _compression_fits(self) -> RunConfig:
        """Which compressions hold with the algorithm, SecAgg, DP and the robust rules (the guide's
        compression section says why): refused here, before any work."""
        comp = self.compression
        if not comp.enabled:
            return self
        name = self.algorithm.name
        up, down = REGISTRY[name].carries(self.algorithm)
        kinds = {d: [p.kind for p in getattr(comp, d)] for d in ("up", "down")}
        for direction, carries in (("up", up), ("down", down)):
            chain = getattr(comp, direction)
            if chain and carries == "exact":
                raise ValueError(
                    f"compression.{direction}: {name}'s {direction}link must arrive exactly (every client "
                    "replays the same history); leave it uncompressed"
                )
        hint = (
            " (event_admm, fedadmm: set algorithm.uplink = 'change')"
            if name in ("event_admm", "fedadmm")
            else ""
        )
        if comp.up and up == "values" and not comp.for_values(comp.up):
            raise ValueError(
                f"compression.up = {kinds['up']}: {name}'s uplink carries values, not changes, and "
                f"sparsifying or QSGD-quantising a value loses most of it; use fp16, bf16, int8 or int4{hint}"
            )
        if comp.up_feedback != "none" and up not in ("updates", "increments"):
            raise ValueError(
                f"compression.up_feedback = '{comp.up_feedback}' feeds back what compression dropped from a "
                f"change; {name}'s uplink carries values{hint}"
            )
        if comp.up_feedback == "ef21" and up == "increments":
            raise ValueError(
                f"compression.up_feedback = 'ef21': {name}'s server adds each uplink into a running sum "
                "(SCAFFOLD's c, event ADMM's copies), where EF21's estimate of each message would leave the "
                "sum off for good; use up_feedback = 'memory', which keeps the sum exact up to what it holds"
            )
        if comp.down and not comp.for_values(comp.down) and comp.down_feedback != "ef21p":
            raise ValueError(
                f"compression.down = {kinds['down']}: the downlink carries the model itself; sparsifiers and "
                "QSGD need compression.down_feedback = 'ef21p' (each client gets the compressed change "
                "from the copy it holds)"
            )
        if comp.up and self.secagg.enabled:
            raise ValueError(
                "[secagg] masks every update in a ring of secagg.bits-bit integers: that is the uplink's "
                "encoding (set secagg.bits); compression.up cannot apply to masked updates"
            )
        robust = self.aggregation.kind != "mean"
        if robust and (not comp.for_values(comp.up) or comp.up_feedback != "none"):
            raise ValueError(
                f"[aggregation] kind = '{self.aggregation.kind}' compares the clients' updates: sparsified "
                "or QSGD-quantised updates differ by their compression more than by their content, and "
                "error memory re-sends what the rule discarded; with a robust rule use fp16, bf16, int8 "
                "or int4 without up_feedback"
            )
        return self

    @model_validator(mode="after")
    def _schedules_span_the_run(self) -> RunConfig:
        """A schedule over rounds without its own horizon spans the run's rounds (written into the
        resolved config, so the run directory says what was used)."""
        algorithm, local = self.algorithm, self.algorithm.local
        if not local.round_schedule.constant and local.round_schedule.steps is None:
            spanned = local.round_schedule.model_copy(update={"steps": self.rounds})
            object.__setattr__(algorithm, "local", local.model_copy(update={"round_schedule": spanned}))
        server = getattr(algorithm, "server_schedule", None)
        if server is not None and not server.constant and server.steps is None:
            object.__setattr__(algorithm, "server_schedule", server.model_copy(update={"steps": self.rounds}))
        return self

    @model_validator(mode="after")
    def _twin_steps(self) -> RunConfig:
        if self.analysis.centralized and self.algorithm.local.steps is None:
            raise ValueError(
                "analysis.centralized takes algorithm.local.steps gradient steps per round, as each client "
                "does; set algorithm.local.steps (with epochs, clients take different numbers of steps)"
            )
        return self


# ----- loading and error messages -----
def _member_for_tag(members: list, tag: Any) -> Any:
    """The member of a discriminated union whose discriminator literal equals ``tag``."""
    for member in members:
        if isinstance(member, type) and issubclass(member, BaseModel):
            for f in member.model_fields.values():
                if typing.get_origin(f.annotation) is Literal and tag in typing.get_args(f.annotation):
                    return member
    return None


def _tag_of(member: type[BaseModel]) -> tuple[str, Any]:
    for name, f in member.model_fields.items():
        if typing.get_origin(f.annotation) is Literal:
            return name, typing.get_args(f.annotation)[0]
    return "", None


def _resolve(loc: tuple, root: type[BaseModel]) -> tuple[list[str], type[BaseModel] | None, list]:
    """Follow a pydantic error location through the config classes.

    Returns the location as the user wrote it (pydantic inserts discriminator tags such as
    'fedavg' into locations; those are dropped) and the model that owns its last key, which
    may be an unknown key, and the other members of the union that owner belongs to.
    """
    path: list[str] = []
    current: Any = root
    members: list = []
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        path.append(str(part))
        if not parts:
            break
        fields = current.model_fields if isinstance(current, type) and issubclass(current, BaseModel) else {}
        if part not in fields:
            path += [str(p) for p in parts]
            return path, None, []
        annotation = fields[part].annotation
        if typing.get_origin(annotation) is Annotated:
            annotation = typing.get_args(annotation)[0]
        if typing.get_origin(annotation) in (tuple, list) and isinstance(parts[0], int):
            path.append(str(parts.pop(0)))  # an item of a list of tables ([compression] up)
            annotation = typing.get_args(annotation)[0]
            if typing.get_origin(annotation) is Annotated:
                annotation = typing.get_args(annotation)[0]
            if not parts:
                break
        union = typing.get_origin(annotation) in (Union, types.UnionType)
        members = [a for a in typing.get_args(annotation) if a is not type(None)] if union else [annotation]
        tagged = _member_for_tag(members, parts[0])
        # the tag pydantic puts before a key (a tag may also name a key: model.factory)
        if tagged is not None and (parts[0] not in tagged.model_fields or len(parts) > 1):
            parts.pop(0)
            current = tagged
        else:
            current = members[0]
    owner = current if isinstance(current, type) and issubclass(current, BaseModel) else None
    return path, owner, [m for m in members if m is not owner]


def _describe(error: dict, root: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    path, owner, siblings = _resolve(loc, root)
    where = ".".join(path) or "(top level)"
    if error["type"] == "extra_forbidden":
        key = str(loc[-1])
        known = sorted(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        for sibling in siblings:
            if key in sibling.model_fields:
                tag, value = _tag_of(sibling)
                hint = f"it applies only with {'.'.join(path[:-1])}.{tag} = '{value}'"
                break
        return f"[{where}] unknown key '{key}': {hint}"
    if error["type"] == "union_tag_invalid":
        ctx = error.get("ctx", {})
        tags = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
        close = difflib.get_close_matches(str(ctx.get("tag")), tags, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"choose one of {', '.join(tags)}"
        key = str(ctx.get("discriminator", "")).strip("'")
        return f"[{where}.{key}] unknown value {ctx.get('tag')!r}: {hint}"
    got = error.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    return f"[{where}] {error['msg']}{shown}"


def set_dotted(tree: dict, dotted: str, value: Any) -> None:
    """``tree[a][b] = value`` for ``dotted`` = 'a.b' (an override before validation)."""
    *parents, last = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: '{part}' is not a table")
    node[last] = value


def parse_override(item: str) -> tuple[str, Any]:
    """'a.b=value' -> ('a.b', value); the value is read as TOML, or as a bare string."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    key, text = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    return key.strip(), value


def validate(tree: dict, source: str, root: type[BaseModel] = RunConfig) -> Any:
    """Validate a config tree against ``root``; errors name the file, the key and the fix."""
    try:
        return root.model_validate(tree)
    except ValidationError as error:
        lines = [_describe(e, root) for e in error.errors()]
        raise ConfigError(f"invalid config {source}:\n  " + "\n  ".join(lines)) from None


def read_tree(path: Path | str, overrides: list[str] = ()) -> dict:
    """The TOML file as a dict, with ``--set`` overrides applied."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        tree = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    for item in overrides:
        set_dotted(tree, *parse_override(item))
    return tree


def load_config(path: Path | str, overrides: list[str] = ()) -> RunConfig:
    return validate(read_tree(path, overrides), str(path))


def run_tree(rundir: Any) -> dict:
    """The config tree of the run in ``rundir`` (report/rundir.py), read without following links; an
    empty or unparsable config.toml is an error naming it (a run is never continued from defaults)."""
    where = rundir.config
    text = rundir.read_text(where)
    if not text.strip():
        raise ConfigError(
            f"{where} is empty (the disk may have been full when the run started); restore the run's "
            "config: taciturn never continues a run from the default config"
        )
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{where} is not valid TOML: {error}") from None
    if not {"type", "name", "seed"} <= tree.keys():
        raise ConfigError(
            f"{where} is not a resolved config (taciturn writes type, name and seed into every run's "
            "config.toml): it was edited or replaced; restore it"
        )
    return tree


def load_run_config(rundir: Any, root: type[BaseModel] = RunConfig) -> Any:
    """The config of the run in ``rundir``, validated and checked against the digest run.json keeps:
    a config.toml that is not the one the run started with is an error naming it."""
    config = validate(run_tree(rundir), str(rundir.config), root)
    rundir.check_config(config)
    return config


def to_toml(config: BaseModel) -> str:
    """The resolved config (defaults filled in) as TOML, so a run directory is self-describing."""
    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))

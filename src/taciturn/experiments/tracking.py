"""Trackers: every row of metrics.jsonl to TensorBoard and MLflow, the config as MLflow parameters.

``[tracking] tensorboard = true`` writes TensorBoard event files into ``<run>/tensorboard`` with
``torch.utils.tensorboard.SummaryWriter`` (extra ``tensorboard``): each numeric column of a row is a
scalar at step = its round, and the resolved config is a text entry. ``mlflow = true`` logs to an
MLflow run through ``mlflow.MlflowClient`` (extra ``mlflow``): the same scalars as metrics at step =
round, the config's keys as parameters (``algorithm.local.lr``...), the run ended FINISHED or FAILED.
MLflow's store is ``mlflow_uri``, by default a SQLite file in the run directory
(``sqlite:///<run>/mlflow.db``: MLflow 3 keeps its file store in maintenance mode); ``mlflow ui
--backend-store-uri sqlite:///runs/NAME/mlflow.db`` shows it.

A resumed run goes on with the same trackers: TensorBoard discards the events past the checkpoint
(``purge_step``), and the MLflow run (its id is in run.json) skips the rows it already holds, which
are the rows the resumed run computes again, number for number.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from typing import Any

from pydantic import Field

from taciturn.algorithms.config import StrictModel
from taciturn.report.rundir import RunDir

EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}


class TrackingConfig(StrictModel):
    tensorboard: bool = Field(False, description="TensorBoard event files in <run>/tensorboard")
    mlflow: bool = Field(False, description="an MLflow run with every metric and the config")
    mlflow_uri: str | None = Field(
        None, min_length=1, description="MLflow tracking URI (default: sqlite:///<run>/mlflow.db)"
    )
    experiment: str | None = Field(
        None, min_length=1, description="MLflow experiment (default: the run's name)"
    )


def check_installed(config: TrackingConfig) -> str | None:
    """Why the configured trackers cannot run here (a missing extra), or None."""
    for key, (module, extra) in EXTRAS.items():
        if getattr(config, key) and importlib.util.find_spec(module) is None:
            return f"[tracking] {key} = true needs {module}: pip install 'taciturn[{extra}]'"
    return None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A config tree as dotted keys and string values (MLflow parameters)."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat |= flatten(value, name + ".")
        else:
            flat[name] = json.dumps(value) if isinstance(value, list | tuple) else str(value)
    return flat


def scalars(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if k != "round" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class Trackers:
    def __init__(
        self, config: TrackingConfig, rundir: RunDir, name: str, tree: dict[str, Any], resumed: int | None
    ):
        """``resumed``: the round of the checkpoint a resumed run starts from (None: a new run)."""
        self.rundir, self.writer, self.client, self.run_id, self.logged = rundir, None, None, None, -1
        if config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resumed is None else resumed + 1
            self.writer = SummaryWriter(log_dir=str(rundir.path / "tensorboard"), purge_step=purge)
            if resumed is None:
                self.writer.add_text("config", "```\n" + rundir.config.read_text() + "\n```", 0)
        if config.mlflow:
            self._start_mlflow(config, name, tree, resumed)

    def _start_mlflow(
        self, config: TrackingConfig, name: str, tree: dict[str, Any], resumed: int | None
    ) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = config.mlflow_uri or f"sqlite:///{self.rundir.path.resolve() / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        info = json.loads(self.rundir.info.read_text())
        if resumed is not None and info.get("mlflow_run_id"):
            self.run_id = info["mlflow_run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            held = [self.client.get_metric_history(self.run_id, "bytes_up")]
            self.logged = max((m.step for m in held[0]), default=-1)
            return
        experiment = config.experiment or name
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        params = [Param(k, v[:6000]) for k, v in flatten(tree).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        self.rundir.info.write_text(json.dumps(info | {"mlflow_run_id": self.run_id, "mlflow_uri": uri}))

    def log(self, row: dict[str, Any]) -> None:
        step, values = int(row["round"]), scalars(row)
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        if self.client is not None and step > self.logged:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            metrics = [Metric(k, v, now, step) for k, v in values.items()]
            for start in range(0, len(metrics), 1000):
                self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def close(self, failed: bool = False) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.client is not None:
            self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")

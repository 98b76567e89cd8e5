"""Trackers and progress (issue 44): TensorBoard event files and an MLflow run, read back with their
own readers (EventAccumulator, MlflowClient); the progress bar of taciturn.run."""

import json

import pytest

import taciturn
from taciturn.experiments.runner import resume, start
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config
from tests.test_runner import Interrupt, stop_after

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")


def scalars_of(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return events, {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def mlflow_run(run):
    from mlflow.tracking import MlflowClient

    info = json.loads((run / "run.json").read_text())
    client = MlflowClient(tracking_uri=info["mlflow_uri"])
    return client, client.get_run(info["mlflow_run_id"])


def test_every_row_reaches_tensorboard_and_mlflow_and_the_config_is_mlflows_parameters(tmp_path):
    config = tiny_config(rounds=3, tracking={"tensorboard": True, "mlflow": True})
    rundir = start(config, tmp_path / "run", progress=False)
    rows = rundir.read_metrics()
    events, scalars = scalars_of(rundir.path)
    assert [step for step, _ in scalars["accuracy"]] == [0, 1, 2, 3]
    for key in ("accuracy", "loss", "bytes_up"):
        assert [v for _, v in scalars[key]] == pytest.approx([r[key] for r in rows], rel=1e-6)
    assert "config/text_summary" in events.Tags()["tensors"]  # the config as text
    client, run = mlflow_run(rundir.path)
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny"
    history = client.get_metric_history(run.info.run_id, "accuracy")
    assert [(m.step, m.value) for m in history] == [(r["round"], pytest.approx(r["accuracy"])) for r in rows]
    params = run.data.params
    assert params["algorithm.local.lr"] == "0.1" and params["partition.num_clients"] == "8"
    assert params["algorithm.name"] == "fedavg"


def test_a_resumed_run_goes_on_with_the_same_trackers_and_no_duplicate_steps(tmp_path):
    config = tiny_config(rounds=5, tracking={"tensorboard": True, "mlflow": True})
    with pytest.raises(Interrupt):
        start(config, tmp_path / "cut", progress=False, callbacks=(stop_after(3),))  # checkpoint at 2
    rundir = resume(tmp_path / "cut", progress=False)
    rows = rundir.read_metrics()
    _, scalars = scalars_of(rundir.path)
    assert [s for s, _ in scalars["loss"]] == [0, 1, 2, 3, 4, 5]  # round 3's first events purged
    assert [v for _, v in scalars["loss"]] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    client, run = mlflow_run(rundir.path)
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [0, 1, 2, 3, 4, 5] and run.info.status == "FINISHED"


def test_a_tracker_that_is_not_installed_is_refused_before_work(tmp_path, monkeypatch):
    import importlib.util

    from taciturn.experiments.config import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'taciturn\[mlflow\]'"):
        start(tiny_config(tracking={"mlflow": True}), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_taciturn_run_shows_progress_in_a_terminal_and_is_silenced_with_progress_false(
    tmp_path, monkeypatch, capsys
):
    import torch

    from taciturn import api
    from taciturn.experiments import progress

    x, y = torch.randn(60, 4), torch.arange(60) % 2
    config = {"rounds": 2, "partition": {"kind": "iid", "num_clients": 2}}
    model = torch.nn.Linear(4, 2)
    monkeypatch.setattr(progress, "show_progress", lambda: True)  # as in a terminal or a notebook
    monkeypatch.setattr(api, "show_progress", progress.show_progress)
    taciturn.run(config, model=model, data=(x, y, x, y), out=tmp_path / "a", report=False)
    assert "round" in capsys.readouterr().out
    taciturn.run(config, model=model, data=(x, y, x, y), out=tmp_path / "b", report=False, progress=False)
    assert "round" not in capsys.readouterr().out
    monkeypatch.undo()
    assert progress.show_progress() is False  # under pytest the output is captured: no terminal
    assert RunDir(tmp_path / "b").read_metrics()[-1]["round"] == 2

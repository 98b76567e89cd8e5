"""The best model kept and early stopping (issue 44)."""

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file

import taciturn
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import resume, start
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config
from tests.test_runner import Interrupt, metrics_without_time, stop_after


def test_the_best_model_is_the_global_model_of_the_best_evaluation_and_exports(tmp_path):
    """best = "accuracy": higher is better by default; best/ holds the model of the row with the
    highest accuracy, which is the checkpoint of that round (every round kept here)."""
    config = tiny_config(
        rounds=6,
        checkpoint={"every": 1, "keep": 10, "best": "accuracy"},
        algorithm={"name": "fedavg", "fraction": 0.5, "local": {"epochs": 1, "batch_size": 16, "lr": 20.0}},
    )
    rundir = start(config, tmp_path / "run", progress=False)
    rows = rundir.read_metrics()
    best_row = max(rows, key=lambda r: r["accuracy"])  # the first of equals, as a strict improvement keeps
    kept = json.loads((rundir.path / "best" / "best.json").read_text())
    assert kept == {
        "round": best_row["round"],
        "metric": "accuracy",
        "mode": "max",
        "value": best_row["accuracy"],
    }
    assert best_row["round"] != rows[-1]["round"]  # lr 20 overshoots: the last model is not the best
    best = taciturn.export(rundir.path, tmp_path / "best.safetensors", best=True)
    same_round = taciturn.export(rundir.path, tmp_path / "round.safetensors", round=best_row["round"])
    last = taciturn.export(rundir.path, tmp_path / "last.safetensors")
    a, b, c = (load_file(str(p)) for p in (best, same_round, last))
    assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)
    page = taciturn.experiments.types.report(rundir).read_text()
    assert f"accuracy {best_row['accuracy']:.4g} at round {best_row['round']}" in page
    with pytest.raises(ConfigError, match="--best and --round"):
        taciturn.export(rundir.path, tmp_path / "x.safetensors", best=True, round=2)


def test_early_stopping_ends_the_run_after_patience_evaluations_and_says_so(tmp_path):
    """An improvement must beat the best by more than min_delta = 1: accuracy (at most 1) never does
    after round 0, so with patience 2 the run ends after round 2 of 10, with a checkpoint there."""
    config = tiny_config(rounds=10, stop={"metric": "accuracy", "patience": 2, "min_delta": 1.0})
    rundir = start(config, tmp_path / "run", progress=False)
    assert [r["round"] for r in rundir.read_metrics()] == [0, 1, 2]
    stopped = json.loads(rundir.info.read_text())["stopped"]
    assert (
        stopped["round"] == 2
        and "accuracy has not improved by more than 1 for 2 evaluations" in stopped["reason"]
    )
    assert rundir.latest_checkpoint()[0] == 2
    page = taciturn.experiments.types.report(rundir).read_text()
    assert "stopped early" in page and "after round 2" in page
    again = resume(tmp_path / "run", progress=False)  # a stopped run stays stopped
    assert [r["round"] for r in again.read_metrics()] == [0, 1, 2]


def test_a_run_that_keeps_improving_is_not_stopped(tmp_path):
    config = tiny_config(rounds=4, stop={"metric": "loss", "patience": 1})
    rows = start(config, tmp_path / "run", progress=False).read_metrics()
    losses = [r["loss"] for r in rows]
    assert all(b < a for a, b in itertools.pairwise(losses))  # each round improved here
    assert rows[-1]["round"] == 4 and "stopped" not in json.loads(RunDir(tmp_path / "run").info.read_text())


def test_resume_keeps_the_best_so_far_and_the_patience_counter(tmp_path):
    """Interrupted after round 3 (checkpoint at 2), resumed: the same rows, the same best model and
    the same stop as a run that never stopped."""
    tree = dict(
        rounds=8,
        checkpoint={"every": 2, "best": "accuracy"},
        stop={"metric": "loss", "patience": 2, "min_delta": 0.02},
        algorithm={"name": "fedavg", "fraction": 0.5, "local": {"epochs": 1, "batch_size": 16, "lr": 1.0}},
    )
    whole = start(tiny_config(**tree), tmp_path / "whole", progress=False)
    with pytest.raises(Interrupt):
        start(tiny_config(**tree), tmp_path / "cut", progress=False, callbacks=(stop_after(3),))
    resumed = resume(tmp_path / "cut", progress=False)
    assert metrics_without_time(resumed) == metrics_without_time(whole)
    for name in ("best.json", "model.safetensors"):
        assert (resumed.path / "best" / name).read_bytes() == (whole.path / "best" / name).read_bytes()
    info = [json.loads(r.info.read_text()).get("stopped") for r in (whole, resumed)]
    assert info[0] == info[1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"checkpoint": {"best": "acuracy"}},
            r"\[checkpoint.best\] 'acuracy' is not a column .*did you mean 'accuracy'",
        ),
        ({"stop": {"metric": "bytes_upp"}}, r"\[stop.metric\] 'bytes_upp' .*did you mean 'bytes_up'"),
        ({"stop": {"metric": "clients"}}, r"cannot tell whether 'clients' is better high or low"),
        ({"stop": {"metric": "loss", "patience": 0}}, r"patience"),
    ],
)
def test_watching_a_column_that_does_not_exist_fails_before_work(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        start(tiny_config(**overrides), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_the_cli_exports_the_best_model(tmp_path):
    from taciturn.cli import main

    start(tiny_config(rounds=2, checkpoint={"best": "accuracy"}), tmp_path / "run", progress=False)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "m.safetensors"), "--best"]) == 0
    assert load_file(str(tmp_path / "m.safetensors"))
    bare = tmp_path / "bare"
    start(tiny_config(rounds=1), bare, progress=False)
    assert main(["export", str(bare), "--out", str(tmp_path / "n.safetensors"), "--best"]) == 2


def test_your_first_metric_leads_the_report_and_every_metric_is_in_its_table(tmp_path):
    """metrics= on class labels: the first one leads (run.json, summary, plots), accuracy follows,
    and report.html's metrics table has a column for each; run.json records the resolved device."""
    x, y = torch.randn(80, 4), torch.arange(80) % 3

    def top2(outputs, targets):
        return (outputs.topk(2, dim=1).indices == targets[:, None]).any(dim=1).float()

    config = {"rounds": 2, "partition": {"kind": "iid", "num_clients": 2}}
    result = taciturn.run(
        config, model=torch.nn.Linear(4, 3), data=(x, y, x, y), metrics={"top2": top2}, out=tmp_path / "r"
    )
    info = json.loads((result.dir / "run.json").read_text())
    assert info["primary_metric"] == "top2" and info["device"] == "cpu"
    page = (result.dir / "report.html").read_text()
    assert "final top2" in page and "<th>top2</th>" in page and "<th>accuracy</th>" in page
    assert "<td>device</td>" in page
    assert list(result.metrics[-1]).index("top2") < list(result.metrics[-1]).index("accuracy")

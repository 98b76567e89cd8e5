"""The lazy-training analysis inside real runs: the centralized twin, resume, errors, report."""

import math

import pytest
import torch

from taciturn.cli import main
from taciturn.core.rng import SERVER
from taciturn.experiments import types
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import prepare, resume, start
from taciturn.report.rundir import RunDir
from taciturn.tasks.lazy import linearized_fedavg, outputs
from taciturn.tasks.ntk import empirical_ntk
from tests.conftest import tiny_config
from tests.test_runner import Interrupt, metrics_without_time, stop_after

ALL_ANALYSIS = {
    "divergence": True,
    "weight_change": True,
    "ntk_change": True,
    "linearization": True,
    "centralized": True,
    "probe_size": 30,
}


def wide_config(steps=3, lr=0.5, model=None, **overrides):
    """Two digit classes, four one-class clients, full participation, full-batch GD, squared loss."""
    tree = {
        "loss": "mse",
        "data": {"dataset": "digits", "classes": [0, 1], "train_size": 40, "test_size": 20},
        "partition": {"kind": "one_class", "num_clients": 4},
        "model": model or {"kind": "mlp", "hidden": [16, 16], "parameterization": "ntk"},
        "algorithm": {
            "name": "fedavg",
            "fraction": 1.0,
            "local": {"steps": steps, "batch_size": 1000, "lr": lr},
        },
        "analysis": ALL_ANALYSIS,
        "rounds": 4,
        "checkpoint": {"every": 2},
    }
    return tiny_config(**{**tree, **overrides})


def test_with_one_local_step_fedavg_is_its_centralized_twin(tmp_path):
    """sum_i (N_i / N) grad L_i = grad L: one full-batch step per round is centralized GD."""
    rows = start(wide_config(steps=1), tmp_path / "run", progress=False).read_metrics()
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    for row in rows:
        assert row["centralized_output_rmse"] < 1e-5 and row["centralized_param_rmse"] < 1e-6
        assert row["centralized_loss"] == pytest.approx(row["loss"], rel=1e-4)
    assert rows[0]["divergence"] is None and rows[0]["ntk_change"] == 0.0 and rows[0]["weight_change"] == 0.0
    assert all(r["divergence"] > 0 and r["ntk_change"] > 0 and r["linearization_rmse"] > 0 for r in rows[1:])
    assert rows[-1]["loss"] < rows[0]["loss"]


def test_with_several_local_steps_heterogeneous_clients_drift_from_the_twin(tmp_path):
    rows = start(wide_config(steps=4), tmp_path / "run", progress=False).read_metrics()
    assert all(r["centralized_output_rmse"] > 1e-3 for r in rows[1:])


def test_a_linear_model_run_follows_the_kernel_dynamics_exactly(tmp_path):
    """Squared loss on a linear model: FedAvg in parameter space is linearized_fedavg in function space."""
    config = wide_config(steps=3, lr=0.05, model={"kind": "logreg"}, analysis={})
    exp = prepare(config, tmp_path)
    params = exp.task.init_params(exp.streams.torch(0, SERVER, "init"))
    state = exp.algorithm.init_server(params, exp.data.num_clients)
    x = torch.cat([exp.data.dataset.x_train, exp.data.dataset.x_test])
    targets = torch.cat([exp.data.dataset.y_train, exp.data.dataset.y_test]).float().unsqueeze(1)
    model = exp.task.model
    clients = [exp.data.client_indices(c).tolist() for c in range(exp.data.num_clients)]
    predicted = linearized_fedavg(
        empirical_ntk(model, params, x), outputs(model, params, x), targets, clients, 0.05, 3, 3
    )
    for round in (1, 2, 3):
        state, _ = exp.federation.run_round(state, round)
        torch.testing.assert_close(outputs(model, state.params, x), predicted[round], rtol=1e-4, atol=1e-4)


def test_resume_with_a_twin_that_has_momentum_gives_the_uninterrupted_numbers(tmp_path):
    config = wide_config(steps=2, lr=0.2, rounds=5)
    config = config.model_copy(
        update={
            "algorithm": config.algorithm.model_copy(
                update={"local": config.algorithm.local.model_copy(update={"momentum": 0.5})}
            )
        }
    )
    whole = start(config, tmp_path / "whole", progress=False)
    with pytest.raises(Interrupt):
        start(config, tmp_path / "cut", progress=False, callbacks=(stop_after(3),))
    assert (RunDir(tmp_path / "cut").checkpoint_dir(2) / "analysis.safetensors").is_file()
    resumed = resume(tmp_path / "cut", progress=False)
    assert metrics_without_time(resumed) == metrics_without_time(whole)


def test_the_report_shows_the_analysis(tmp_path):
    rundir = types.start(wide_config(), tmp_path / "run", progress=False)
    for png in ("analysis", "centralized"):
        assert (rundir.plots / f"{png}.png").stat().st_size > 1000
    assert "Lazy-training analysis" in rundir.report.read_text()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"algorithm": {"name": "fedavg", "local": {"epochs": 2}}}, "set algorithm.local.steps"),
        ({"model": {"kind": "mlp", "weight_var": 2.0}}, "weight_var applies only with parameterization"),
        ({"analysis": {"ntk_chang": True}}, "did you mean 'ntk_change'"),
        ({"data": {"dataset": "synthetic"}, "model": {"kind": "lenet"}}, "'lenet' needs image data"),
        (
            {"model": {"kind": "lenet", "width": 0}},
            r"\[model.width\] Input should be greater than or equal to 1",
        ),
    ],
)
def test_analysis_and_model_options_are_checked_before_any_work(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        wide_config(**overrides)


def test_an_impossible_subset_is_a_config_error(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[data]\ndataset = "digits"\nclasses = [0, 1]\ntrain_size = 5000\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "[data] data.train_size = 5000, but only" in capsys.readouterr().err.replace("\n", " ")


def test_the_analysis_columns_take_their_exact_values_where_the_answer_is_known(tmp_path):
    """A linear model's NTK never changes; a federation of one client has zero divergence. A run
    that mixed up the columns or measured the wrong model would show non-zero values here (and the
    > 0 checks above show they are not always 0)."""
    linear = start(wide_config(model={"kind": "logreg"}), tmp_path / "linear", progress=False).read_metrics()
    for row in linear[1:]:
        assert row["ntk_change"] == pytest.approx(0.0, abs=1e-6)
        # f = f_lin exactly for a linear model; what remains is float32 rounding of outputs that grow
        # with the (diverging, lr 0.5) run: |f| ~ sqrt(test MSE) up to 1e9 here, the RMSE ~1e-7 of it
        assert row["linearization_rmse"] <= 1e-6 * math.sqrt(row["loss"])
        assert row["divergence"] > 1e-3 and row["weight_change"] > 1e-3  # the model moved; clients differ
    alone = wide_config(partition={"kind": "iid", "num_clients": 1})
    for row in start(alone, tmp_path / "alone", progress=False).read_metrics()[1:]:
        assert row["divergence"] == 0.0

"""taciturn.run / resume / export with the user's own model, data and loss (issue 15)."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

import taciturn
from taciturn.experiments.config import ConfigError
from taciturn.report.rundir import RunDir, RunDirError
from tests.test_runner import Interrupt, metrics_without_time, stop_after


def blobs(n=240, features=6, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(1)
    return x, y


def linear_model(seed=0, features=6, classes=3):
    torch.manual_seed(seed)
    return nn.Linear(features, classes)


CONFIG = {
    "name": "mine",
    "rounds": 4,
    "partition": {"kind": "iid", "num_clients": 4},
    "algorithm": {"fraction": 0.5, "local": {"batch_size": 16, "lr": 0.1}},
    "checkpoint": {"every": 2},
    "engine": {"executor": "sequential"},
}


def test_one_client_full_batch_round_is_one_gradient_step_of_the_users_model(tmp_path):
    """FedAvg with one client, one full-batch step: the global model is w - lr grad L(w) exactly."""
    x, y = blobs()
    start = linear_model()
    config = {
        "rounds": 1,
        "partition": {"kind": "iid", "num_clients": 1},
        "algorithm": {"fraction": 1.0, "local": {"steps": 1, "batch_size": 1000, "lr": 0.5}},
        "engine": {"executor": "sequential"},
    }
    data = taciturn.data.from_tensors(x[:200], y[:200], x[200:], y[200:])
    result = taciturn.run(config, model=start, data=data, out=tmp_path / "run")
    reference = linear_model()
    F.cross_entropy(reference(x[:200]), y[:200]).backward()
    trained = result.model
    assert type(trained) is nn.Linear
    for name, p in reference.named_parameters():
        assert torch.allclose(getattr(trained, name), p - 0.5 * p.grad, atol=1e-6)
    rows = result.metrics
    assert [r["round"] for r in rows] == [0, 1]
    with torch.no_grad():  # round 0 evaluates the model as given, on the test tensors
        assert rows[0]["accuracy"] == pytest.approx(
            float((start(x[200:]).argmax(1) == y[200:]).float().mean())
        )
        assert rows[0]["loss"] == pytest.approx(float(F.cross_entropy(start(x[200:]), y[200:])), rel=1e-5)
    assert RunDir(result.dir).report.is_file()


def test_user_loss_and_metrics_for_regression(tmp_path):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]])
    data = taciturn.data.from_tensors(x[:160], y[:160], x[160:], y[160:])

    def mae(outputs, targets):
        return (outputs - targets).abs().mean(dim=1)

    model = linear_model(features=4, classes=1)
    result = taciturn.run(
        CONFIG, model=model, data=data, loss=F.mse_loss, metrics={"mae": mae}, out=tmp_path / "reg"
    )
    rows = result.metrics
    assert set(rows[0]) >= {"loss", "mae"} and "accuracy" not in rows[0]
    with torch.no_grad():
        assert rows[0]["mae"] == pytest.approx(float(mae(model(x[160:]), y[160:]).mean()), rel=1e-5)
        assert rows[0]["loss"] == pytest.approx(float(F.mse_loss(model(x[160:]), y[160:])), rel=1e-5)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert RunDir(result.dir).primary_metric() == "mae"


def test_a_torch_dataset_pair_gives_the_numbers_of_the_same_tensors(tmp_path):
    x, y = blobs()
    train = torch.utils.data.TensorDataset(x[:200], y[:200])
    test = torch.utils.data.TensorDataset(x[200:], y[200:])
    a = taciturn.run(CONFIG, model=linear_model(), data=(train, test), out=tmp_path / "a", report=False)
    b = taciturn.run(
        CONFIG,
        model=linear_model(),
        data=taciturn.data.from_tensors(x[:200], y[:200], x[200:], y[200:]),
        out=tmp_path / "b",
    )
    assert metrics_without_time(RunDir(a.dir)) == metrics_without_time(RunDir(b.dir))


def test_resume_with_objects_ends_with_the_numbers_of_an_uninterrupted_run(tmp_path):
    x, y = blobs()
    data = taciturn.data.from_tensors(x[:200], y[:200], x[200:], y[200:])
    whole = taciturn.run(CONFIG, model=linear_model(), data=data, out=tmp_path / "whole", report=False)
    from taciturn.experiments import runner
    from taciturn.experiments.config import validate
    from taciturn.experiments.user import UserObjects

    tree = {**CONFIG, "model": {"kind": "python"}, "data": {"dataset": "python"}}
    with pytest.raises(Interrupt):
        runner.start(
            validate(tree, "<test>"),
            tmp_path / "cut",
            progress=False,
            callbacks=(stop_after(3),),
            objects=UserObjects(linear_model(), data),
        )
    with pytest.raises(
        ConfigError,
        match=r"model and data were Python objects; .*taciturn.resume\(run_dir, model=\.\.\., data=\.\.\.\)",
    ):
        taciturn.resume(tmp_path / "cut")
    resumed = taciturn.resume(tmp_path / "cut", model=linear_model(), data=data)
    assert metrics_without_time(RunDir(resumed.dir)) == metrics_without_time(RunDir(whole.dir))
    for name, p in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], p)


def test_objects_and_config_tables_cannot_both_name_the_model(tmp_path):
    x, y = blobs()
    data = taciturn.data.from_tensors(x[:200], y[:200], x[200:], y[200:])
    with pytest.raises(ConfigError, match=r"\[model\] is given twice"):
        taciturn.run(
            {**CONFIG, "model": {"kind": "mlp"}},
            model=linear_model(),
            data=data,
            out=tmp_path / "x",
            report=False,
        )
    with pytest.raises(ConfigError, match=r"\[algorithm.local.lrr\] unknown key 'lrr': did you mean 'lr'"):
        bad = {**CONFIG, "algorithm": {"local": {"lrr": 0.1}}}
        taciturn.run(bad, model=linear_model(), data=data, out=tmp_path / "y", report=False)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_a_model_that_does_not_fit_the_data_fails_before_any_work(tmp_path):
    x, y = blobs()
    data = taciturn.data.from_tensors(x[:200], y[:200], x[200:], y[200:])
    with pytest.raises(ConfigError, match=r"\[model\] the model fails on the data \(inputs \(6,\)\)"):
        taciturn.run(CONFIG, model=nn.Linear(5, 3), data=data, out=tmp_path / "a", report=False)
    with pytest.raises(ConfigError, match=r"outputs of shape \(2,\) for 3 classes"):
        taciturn.run(CONFIG, model=nn.Linear(6, 2), data=data, out=tmp_path / "b", report=False)
    regression = taciturn.data.from_tensors(x[:200], x[:200, :1], x[200:], x[200:, :1])
    with pytest.raises(ConfigError, match=r"\[loss\] the targets are not class labels"):
        taciturn.run(CONFIG, model=nn.Linear(6, 1), data=regression, out=tmp_path / "c", report=False)
    with pytest.raises(ConfigError, match=r"\[partition.kind\] 'dirichlet' splits by class"):
        config = {**CONFIG, "partition": {"kind": "dirichlet", "num_clients": 4}}
        taciturn.run(
            config, model=nn.Linear(6, 1), data=regression, loss=F.mse_loss, out=tmp_path / "d", report=False
        )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((torch.zeros(3, 2), torch.zeros(2, dtype=torch.long)), "x_train has 3 samples but y_train has 2"),
        ((torch.zeros(3, 2), torch.tensor([0, -1, 1])), "class labels must be 0, 1, ...; found -1"),
    ],
)
def test_from_tensors_refuses_inconsistent_tensors(args, message):
    from taciturn.data.datasets import DataError

    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        taciturn.data.from_tensors(*args, torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))


def test_export_writes_a_state_dict_the_users_class_loads(tmp_path):
    x, y = blobs()
    data = taciturn.data.from_tensors(x[:200], y[:200], x[200:], y[200:])
    result = taciturn.run(CONFIG, model=linear_model(), data=data, out=tmp_path / "run", report=False)
    path = taciturn.export(result.dir, tmp_path / "model.safetensors")
    fresh = nn.Linear(6, 3)
    fresh.load_state_dict(load_file(str(path)))  # strict: exactly the module's own names
    for name, p in result.model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], p)
    with pytest.raises(RunDirError, match="exists"):
        taciturn.export(result.dir, path)
    earlier = taciturn.export(result.dir, tmp_path / "r2.safetensors", round=2)
    assert not torch.equal(load_file(str(earlier))["weight"], load_file(str(path))["weight"])
    with pytest.raises(ConfigError, match=r"keeps checkpoints of rounds \[2, 4\]"):
        taciturn.export(result.dir, tmp_path / "r1.safetensors", round=1)


def test_a_users_loss_gives_the_same_numbers_vectorized_and_sequential(tmp_path):
    """The vectorized executor pads and weights each client's samples: per-sample losses must be
    one number per sample (a (B, 1) regression output reduced over its elements)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]])
    data = taciturn.data.from_tensors(x[:160], y[:160], x[160:], y[160:])
    rows = {}
    for executor in ("sequential", "vectorized"):
        config = {**CONFIG, "engine": {"executor": executor}}
        result = taciturn.run(
            config,
            model=linear_model(features=4, classes=1),
            data=data,
            loss=F.mse_loss,
            out=tmp_path / executor,
        )
        rows[executor] = result.metrics
    for a, b in zip(rows["sequential"], rows["vectorized"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)


def test_divergence_is_warned_in_the_log_and_the_report(tmp_path, caplog):
    """A learning rate far too large: the held-out loss leaves 10x its start; run.log has a line per
    evaluated round, the warning and a final line; the report shows the warning."""
    x, y = blobs()
    data = taciturn.data.from_tensors(x[:200] * 50, y[:200], x[200:] * 50, y[200:])
    config = {**CONFIG, "algorithm": {"fraction": 1.0, "local": {"batch_size": 16, "lr": 50.0}}}
    result = taciturn.run(config, model=linear_model(), data=data, out=tmp_path / "run")
    log = RunDir(result.dir).log.read_text()
    rounds = [
        line.split("taciturn: round ")[1].split(":")[0]
        for line in log.splitlines()
        if "taciturn: round " in line
    ]
    assert rounds == ["1", "2", "3", "4"]
    assert log.count("the run is diverging; lower the learning rate") + log.count("the run diverged") == 1
    assert "finished: round 4:" in log
    assert "Warning: the held-out loss" in RunDir(result.dir).report.read_text()
    calm = taciturn.run(CONFIG, model=linear_model(), data=data, out=tmp_path / "calm", report=False)
    assert "diverg" not in RunDir(calm.dir).log.read_text()


def test_divergence_rules():
    from taciturn.report.divergence import divergence

    assert divergence([{"round": 0, "loss": 1.0}, {"round": 1, "loss": 9.9}]) is None
    assert "over 10x" in divergence([{"round": 0, "loss": 1.0}, {"round": 3, "loss": 10.5}])
    assert "is nan at round 2" in divergence([{"round": 0, "loss": 1.0}, {"round": 2, "loss": float("nan")}])


def test_the_report_counts_the_lowest_loss_as_best():
    from taciturn.report.html import summary

    rows = [
        {"round": r, "loss": loss, "bytes_up": 0, "bytes_down": 0, "messages_up": 0, "messages_down": 0}
        | {"delivered_up": 0, "delivered_down": 0, "rejected": 0, "failed": 0, "wall_s": 0.0}
        for r, loss in enumerate([2.0, 0.5, 0.7])
    ]
    assert summary(rows, "loss")["best loss"] == "0.5000 (round 1)"

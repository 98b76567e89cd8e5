"""Plugins in TOML: model.factory, data.factory and loss by import path; CLI run, resume, export."""

import textwrap

import pytest
import torch
from safetensors.torch import load_file

from taciturn.cli import main
from taciturn.experiments import runner, types
from taciturn.experiments.config import ConfigError
from taciturn.report.rundir import RunDir
from tests.test_runner import Interrupt, metrics_without_time, stop_after

MODULE = """
import torch
from torch import nn

def net(hidden=8):
    return nn.Sequential(nn.Linear(6, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 3))

def data(n=240):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = (x @ torch.randn(6, 3, generator=g)).argmax(1)
    return x[:200], y[:200], x[200:], y[200:]

def smooth_loss(outputs, targets):
    return nn.functional.cross_entropy(outputs, targets, label_smoothing=0.1)

def weights(hidden=8):
    return torch.zeros(hidden)

not_callable = 3
"""

CONFIG = """
name = "plug"
rounds = 4
loss = "{loss}"
[model]
factory = "{model}"
kwargs = {{ hidden = 8 }}
buffers = "{buffers}"
[data]
factory = "mymodels:data"
[partition]
kind = "iid"
num_clients = 4
[algorithm]
fraction = 0.5
[checkpoint]
every = 2
[engine]
executor = "sequential"
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))

    def config(model="mymodels:net", loss="cross_entropy", buffers="federated"):
        path = tmp_path / f"{model.replace(':', '_')}_{loss.replace(':', '_')}_{buffers}.toml"
        path.write_text(CONFIG.format(model=model, loss=loss, buffers=buffers))
        return path

    return config


@pytest.mark.parametrize("buffers", ["federated", "local"])
def test_cli_run_resume_report_and_export_of_a_factory_model_with_batchnorm(tmp_path, plugin, buffers):
    """The issue's "done when" from TOML alone: a factory model with BatchNorm runs, reports, resumes
    to the numbers of an uninterrupted run and exports a state_dict its class loads, with the
    statistics averaged (federated) or kept by the clients (local: FedBN, reported per client)."""
    config = plugin(buffers=buffers)
    assert main(["run", str(config), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["run", str(config), "--out", str(tmp_path / "b"), "--quiet", "--no-report"]) == 0
    a, b = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    assert metrics_without_time(a) == metrics_without_time(b)  # the factory ran under the run's seed
    rows = a.read_metrics()
    page = a.report.read_text()
    assert "<h2>Metrics</h2>" in page and "mymodels:net" in page  # the report, with the config shown
    if buffers == "federated":
        assert rows[-1]["accuracy"] > rows[0]["accuracy"]
        assert "local_accuracy" not in rows[-1]
    else:  # each client's own model learned; the global one keeps the initial statistics
        assert rows[-1]["local_clients"] > 0
        assert rows[-1]["local_accuracy"] > rows[0]["accuracy"]
        assert "Each client's own model (FedBN)" in page

    with pytest.raises(Interrupt):
        runner.start(types.load(config), tmp_path / "cut", progress=False, callbacks=(stop_after(3),))
    assert main(["resume", str(tmp_path / "cut"), "--quiet"]) == 0  # no Python needed: the config names it
    assert metrics_without_time(RunDir(tmp_path / "cut")) == metrics_without_time(a)
    assert RunDir(tmp_path / "cut").report.is_file()

    out = tmp_path / "model.safetensors"
    assert main(["export", str(tmp_path / "a"), "--out", str(out)]) == 0
    import mymodels

    model = mymodels.net(hidden=8)
    model.load_state_dict(load_file(str(out)))  # strict: the user's own names, nothing added
    server = load_file(str(a.checkpoint_dir(4) / "server.safetensors"))  # FedAvgState.params
    for name, tensor in server.items():
        assert torch.equal(model.state_dict()[name.removeprefix("params/")], tensor)
    initial_mean = torch.zeros(8)  # BatchNorm1d's initial running mean
    assert torch.equal(model[1].running_mean, initial_mean) == (buffers == "local")
    assert main(["export", str(tmp_path / "a"), "--out", str(out)]) == 2  # never overwrites


def test_a_loss_by_import_path(tmp_path, plugin):
    rundir = types.start(
        types.load(plugin(loss="mymodels:smooth_loss")), tmp_path / "run", report=False, progress=False
    )
    plain = types.start(types.load(plugin()), tmp_path / "plain", report=False, progress=False)
    first, reference = rundir.read_metrics()[0], plain.read_metrics()[0]
    assert first["accuracy"] == reference["accuracy"]  # the same start model and data
    assert first["loss"] != reference["loss"]  # smoothed cross-entropy


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("nosuchmodule:net", r"\[model.factory\] cannot import 'nosuchmodule' \(from 'nosuchmodule:net'\)"),
        ("mymodels:nte", r"\[model.factory\] 'mymodels' has no attribute 'nte' .*did you mean 'net'\?"),
        ("mymodels:not_callable", r"\[model.factory\] 'mymodels:not_callable' is a int, not a callable"),
        ("mymodels:weights", r"\[model.factory\] mymodels:weights returned a Tensor, not an nn.Module"),
        ("mymodels:data", r"mymodels:data\(\*\*\{'hidden': 8\}\) raised TypeError: .*unexpected keyword"),
    ],
)
def test_a_factory_that_does_not_resolve_fails_before_work(tmp_path, plugin, model, message):
    with pytest.raises(ConfigError, match=message):
        types.start(types.load(plugin(model=model)), tmp_path / "run", report=False, progress=False)
    assert not (tmp_path / "run").exists()


def test_an_import_path_must_look_like_one(tmp_path, plugin):
    with pytest.raises(ConfigError, match=r"\[model.factory\] String should match pattern"):
        types.load(plugin(model="mymodels.net"))
    with pytest.raises(
        ConfigError, match=r"\[loss\] .*unknown loss 'cross_entropi'.*did you mean 'cross_entropy'"
    ):
        types.load(plugin(loss="cross_entropi"))

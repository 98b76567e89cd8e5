"""Runs a config or a caller can make go wrong (issue 40): bounds are checked before any work (no
fork, thread or allocation first), user metric names cannot shadow taciturn's columns, every string
a user controls is escaped in report.html, and whatever goes wrong ends in the layer's clean error,
never a traceback."""

import json
import multiprocessing.process
import os
import subprocess
import sys

import pytest
import torch
from conftest import forge_manifest, tiny_config
from torch import nn

import taciturn
from taciturn.cli import main
from taciturn.core.errors import TaciturnError
from taciturn.experiments import types
from taciturn.experiments.config import ConfigError, to_toml, validate


def _no_work(monkeypatch, *targets: str) -> None:
    """Make the first piece of work fail the test: a bound must refuse the config before it."""
    for target in targets:
        monkeypatch.setattr(target, _work_started(target))


def _work_started(target):
    def started(*args, **kwargs):
        raise AssertionError(f"work started ({target}) before the config was refused")

    return started


def _refused(config, run, match: str, variable: str) -> None:
    """Starting the run fails with a ConfigError whose message says the limit and how to raise it."""
    with pytest.raises(ConfigError, match=match) as refused:
        types.start(config, run, progress=False)
    message = str(refused.value)
    assert "limit" in message and f"export {variable}=" in message, message


# ----- bounds before work -----
def test_thousands_of_workers_are_refused_before_any_fork(monkeypatch, tmp_path):
    """`executor = "parallel"` with `workers = 4096` forked thousands of processes and froze the
    machine. Any fork here fails the test instead of forking."""
    _no_work(monkeypatch, "os.fork", "multiprocessing.process.BaseProcess.start")
    config = tiny_config(engine={"executor": "parallel", "workers": 4096})
    _refused(config, tmp_path / "run", r"\[engine.workers\] is 4,096", "TACITURN_MAX_WORKERS")
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("TACITURN_MAX_WORKERS", "5000")  # raised: the bound lets it through (to the fork)
    with pytest.raises(AssertionError, match="work started"):
        types.start(config, tmp_path / "run", progress=False)
    assert multiprocessing.process.active_children() == []


def test_a_hundred_million_threads_are_refused_not_aborted_in_openmp(tmp_path):
    """engine.threads = 1e8 aborted the process inside libgomp: a separate process here."""
    config = tmp_path / "c.toml"
    config.write_text(to_toml(tiny_config(rounds=1)))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "taciturn.cli",
            "run",
            str(config),
            "--set",
            "engine.threads=1e8",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "[engine.threads] is 100,000,000" in done.stderr and "TACITURN_MAX_THREADS" in done.stderr


def test_a_billion_clipping_iterations_are_refused(monkeypatch, tmp_path):
    _no_work(monkeypatch, "taciturn.engine.federation.Federation.run_round")
    config = tiny_config(aggregation={"kind": "centered_clip", "iterations": 10**9})
    _refused(config, tmp_path / "run", r"\[aggregation.iterations\]", "TACITURN_MAX_ITERATIONS")


def test_a_hundred_million_classes_are_refused_before_any_sample_is_drawn(monkeypatch, tmp_path):
    _no_work(monkeypatch, "taciturn.data.synthetic.load")
    with pytest.raises(ConfigError, match="num_classes = 100,000,000 is more than num_samples"):
        tiny_config(data={"dataset": "synthetic", "num_classes": 10**8})
    config = tiny_config(data={"dataset": "synthetic", "num_classes": 10**8, "num_samples": 10**8})
    _refused(config, tmp_path / "run", r"\[data.num_classes\]", "TACITURN_MAX_CLASSES")


def test_a_billion_clients_are_refused_before_the_partition(monkeypatch, tmp_path):
    _no_work(monkeypatch, "taciturn.experiments.runner.partition")
    config = tiny_config(partition={"kind": "dirichlet", "num_clients": 10**9})
    _refused(config, tmp_path / "run", r"\[partition\] 1,000,000,000 clients", "TACITURN_MAX_MEMORY_GIB")


MEMORY = {
    "fedq": (
        {"type": "fedq", "mdp": {"states": 100_000, "actions": 10, "horizon": 10}},
        "taciturn.experiments.fedq.random_mdp",
    ),
    "bandits": (
        {"type": "bandits", "environment": {"num_agents": 10_000_000, "dim": 5}},
        "taciturn.experiments.bandits.environment",
    ),
    "causal_lm": (
        {
            "data": {"dataset": "instructions"},
            "model": {"kind": "causal_lm", "hidden": 16384, "layers": 8, "heads": 8},
            "partition": {"kind": "iid", "num_clients": 2},
        },
        "taciturn.experiments.language.load_instructions",
    ),
    "causal_lm-layers": (  # 10**9 layers: even on the meta device, 10**9 Python modules
        {
            "data": {"dataset": "instructions"},
            "model": {"kind": "causal_lm", "hidden": 8, "layers": 10**9, "heads": 2},
            "partition": {"kind": "iid", "num_clients": 2},
        },
        "taciturn.experiments.language.load_instructions",
    ),
}


@pytest.mark.parametrize("kind", sorted(MEMORY))
def test_every_run_type_checks_its_memory_before_allocating(monkeypatch, tmp_path, kind):
    """fedq 7.28 TiB, bandits 728 TiB, causal_lm 16 GiB: once allocation tracebacks or a swapping
    machine; the limit is the machine's memory unless TACITURN_MAX_MEMORY_GIB says otherwise."""
    tree, first_work = MEMORY[kind]
    _no_work(monkeypatch, first_work)
    config = types.validate_tree(tree, "<test>")
    _refused(config, tmp_path / "run", "needs at least", "TACITURN_MAX_MEMORY_GIB")
    assert not (tmp_path / "run").exists()


def test_the_memory_limit_can_be_lowered_for_this_shell(monkeypatch, tmp_path):
    monkeypatch.setenv("TACITURN_MAX_MEMORY_GIB", "0.001")
    config = tiny_config(data={"dataset": "synthetic", "num_samples": 100_000})
    with pytest.raises(ConfigError, match=r"limit of 0\.0 GiB \(TACITURN_MAX_MEMORY_GIB\)"):
        types.start(config, tmp_path / "run", progress=False)


# ----- metrics, models and the front door -----
def _data(n=60):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 10, generator=g)
    y = (torch.arange(n) % 3).long()
    return taciturn.data.from_tensors(x, y, x[:15], y[:15])


def _accuracy(outputs, targets):
    return (outputs.argmax(1) == targets).float()


API = {"rounds": 2, "partition": {"kind": "iid", "num_clients": 3}, "engine": {"executor": "sequential"}}


@pytest.mark.parametrize("name", ["round", "loss", "bytes_up", "wall_s", "local_accuracy", "epsilon"])
def test_a_metric_cannot_shadow_a_column_taciturn_writes(tmp_path, name):
    """A metric named `round` silently replaced the round column of every row."""
    with pytest.raises(ConfigError, match=f"metrics\\['{name}'\\]: '{name}' is a column taciturn writes"):
        taciturn.run(API, model=nn.Linear(10, 3), data=_data(), metrics={name: _accuracy}, out=tmp_path / "r")


class _Int64Outputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(10, 3)

    def forward(self, x):
        return self.linear(x).round().long()


class _FailsWhenTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(10, 3)

    def forward(self, x):
        if self.training:
            raise RuntimeError("this model cannot train")
        return self.linear(x)


def _meta_model():
    with torch.device("meta"):
        return nn.Linear(10, 3)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"config": 42}, "config= must be a dict or the path of a TOML file, got int"),
        ({"model": "_meta"}, "on PyTorch's meta device"),
        ({"model": _Int64Outputs()}, "floating-point outputs"),
        ({"metrics": {"text": lambda out, y: "good"}}, "'text' must return a number"),
        ({"metrics": {"many": lambda out, y: torch.ones(7)}}, "'many' must return a number"),
        ({"metrics": {"raises": lambda out, y: 1 / 0}}, "'raises' fails on the model's outputs"),
        ({"model": _FailsWhenTraining()}, "every client failed in round 1"),
        ({"out": 3.5}, "out= must be a path"),
        ({"overwrite": "yes"}, "overwrite= must be True or False"),
        ({"metrics": [_accuracy]}, "metrics= must be a dict"),
    ],
    ids=[
        "config-42",
        "meta",
        "int64",
        "string-metric",
        "wrong-length",
        "raising-metric",
        "fails-on-every-client",
        "out",
        "overwrite",
        "metrics-list",
    ],
)
def test_the_python_api_fails_with_the_layers_error(tmp_path, kwargs, says):
    given = {"config": API, "model": nn.Linear(10, 3), "data": _data(), "out": tmp_path / "run"} | kwargs
    if given["model"] == "_meta":
        given["model"] = _meta_model()
    with pytest.raises(TaciturnError) as failed:
        taciturn.run(**given)
    assert says in str(failed.value)


def test_a_model_that_fails_on_every_client_is_one_line_from_the_cli(tmp_path, monkeypatch, capsys):
    """It was an uncaught RunFailed: a traceback and exit code 1."""
    (tmp_path / "failing_models.py").write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(10, 3)\n"
        "    def forward(self, x):\n"
        "        if self.training:\n"
        "            raise RuntimeError('cannot train')\n"
        "        return self.linear(x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "c.toml"
    config.write_text(to_toml(tiny_config(model={"kind": "factory", "factory": "failing_models:Net"})))
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "every client failed in round 1" in err and "cannot train" in err and "Traceback" not in err


# ----- report.html escapes every string a user controls -----
class _BnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(10, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.layers(x)


SCRIPT = "<script>alert(1)</script>"


def _loss_that_fails_for_class_2(outputs, targets):
    if bool((targets == 2).all()) and len(targets) > 2:  # the client that holds only class 2
        raise ValueError(SCRIPT)
    return torch.nn.functional.cross_entropy(outputs, targets)


def test_a_report_of_a_run_whose_every_string_is_a_script_has_no_script(tmp_path):
    """FedBN's local_loss, local_accuracy and local_clients went into report.html unescaped; the
    run's name, a metric's name, a client's error and every value of a received metrics.jsonl
    are the user's strings too."""
    config = {
        "name": SCRIPT.replace("/", "|"),  # a run name is one folder name
        "rounds": 2,
        "partition": {"kind": "one_class", "num_clients": 3},
        "algorithm": {"fraction": 1.0, "local": {"steps": 2, "batch_size": 8}},
        "model": {"buffers": "local"},
        "engine": {"executor": "sequential"},
    }
    result = taciturn.run(
        config,
        model=_BnNet(),
        data=_data(),
        loss=_loss_that_fails_for_class_2,
        metrics={SCRIPT: _accuracy},
        out=tmp_path / "run",
    )
    run = result.dir
    assert any(
        SCRIPT in e["reason"] for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "local_clients" in rows[-1] and SCRIPT in rows[-1]
    for key in ("local_loss", f"local_{SCRIPT}", "local_clients"):
        rows[-1][key] = SCRIPT  # what a received folder may hold
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    forge_manifest(run)
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_received_config_is_shown_escaped(tmp_path):
    config = validate(
        {"name": "x", **{k: v for k, v in tiny_config().model_dump().items() if k != "name"}}, "<t>"
    )
    run = types.start(config, tmp_path / "run", progress=False)
    text = run.config.read_text().replace('name = "x"', f'name = "x"\n# {SCRIPT}')
    run.config.write_text(text)
    forge_manifest(run.path)
    page = types.report(run).read_text()
    assert "<script" not in page.lower()

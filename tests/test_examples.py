"""docs/guide.md cannot rot: every example it shows is a file in examples/, shown verbatim, and run here."""

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from taciturn.cli import main
from taciturn.report.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guide.md"
SHOWN = re.compile(r"<!-- example: (\S+) -->\n```\w+\n(.*?)```", re.S)


def shown_examples() -> dict[str, str]:
    return {path: code for path, code in SHOWN.findall(GUIDE.read_text())}


def test_the_guide_shows_every_example_file_verbatim():
    shown = shown_examples()
    files = sorted(
        str(p.relative_to(REPO)) for p in (REPO / "examples").iterdir() if p.suffix in (".py", ".toml")
    )
    assert sorted(shown) == files
    for path, code in shown.items():
        assert code == (REPO / path).read_text(), f"docs/guide.md shows an outdated {path}"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO))  # examples/ as a package, as from the repository root
    return tmp_path


def test_own_model_example(in_tmp):
    scope = runpy.run_path(str(REPO / "examples" / "own_model.py"), run_name="__main__")
    result, model = scope["result"], scope["model"]
    assert result.metrics[-1]["accuracy"] > result.metrics[0]["accuracy"] + 0.3  # it learned
    for name, tensor in result.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor)
    assert RunDir(result.dir).report.is_file()


def test_torch_dataset_example(in_tmp):
    result = runpy.run_path(str(REPO / "examples" / "torch_dataset.py"), run_name="__main__")["result"]
    assert result.metrics[-1]["mae"] < 0.25 * result.metrics[0]["mae"]


def test_plugin_example_from_the_command_line(in_tmp):
    config = str(REPO / "examples" / "plugin.toml")
    assert main(["run", config, "--quiet", "--no-report"]) == 0
    assert main(["export", "runs/plugin", "--out", "plugin.safetensors"]) == 0
    from examples.mymodels import net

    model = net(hidden=32)
    model.load_state_dict(load_file("plugin.safetensors"))
    rows = RunDir(in_tmp / "runs" / "plugin").read_metrics()
    assert rows[-1]["accuracy"] > rows[0]["accuracy"]


def test_compression_example_from_the_command_line(in_tmp):
    assert main(["run", str(REPO / "examples" / "compression.toml"), "--quiet", "--no-report"]) == 0
    run = RunDir(in_tmp / "runs" / "compression")
    rows = run.read_metrics()
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] + 0.3  # it learned
    model_bytes = 4 * (64 * 32 + 32 + 32 * 10 + 10)  # the MLP in float32
    last = rows[-1]
    # top 5% in fp16 with uint16 indices, 8 headers: well under a sixth of the float32 update
    assert last["bytes_up"] / last["messages_up"] < model_bytes / 6
    # int8 codes and one float32 scale per 64 values: about a third of the float32 model
    assert last["bytes_down"] / last["messages_down"] < model_bytes / 2.5


def test_hf_text_example(in_tmp):
    pytest.importorskip("datasets")
    scope = runpy.run_path(str(REPO / "examples" / "hf_text.py"), run_name="__main__")
    result, reloaded = scope["result"], scope["model"]
    assert result.metrics[-1]["accuracy"] >= 0.9  # the label word is in every review
    for name, tensor in result.model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor)


def test_clients_example_evaluates_on_each_clients_own_held_out_split(in_tmp):
    config = str(REPO / "examples" / "clients.toml")
    assert main(["run", config, "--quiet", "--no-report"]) == 0
    rows = RunDir(in_tmp / "runs" / "clients").read_metrics()
    held_out = sum(n // 5 for n in (150, 300, 450))
    assert all(r["eval_on"] == "clients" and r["eval_samples"] == held_out for r in rows)
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] + 0.3  # it learned


def test_hf_object_example(in_tmp):
    """A transformers model object as model= (issue 44): it learns, comes back as its own class, and
    save_pretrained writes the trained weights."""
    transformers = pytest.importorskip("transformers")
    scope = runpy.run_path(str(REPO / "examples" / "hf_object.py"), run_name="__main__")
    result, trained, reloaded = scope["result"], scope["trained"], scope["reloaded"]
    assert result.metrics[-1]["accuracy"] > result.metrics[0]["accuracy"] + 0.3
    assert isinstance(trained, transformers.BertForSequenceClassification)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor)


def test_client_eval_example(in_tmp):
    """[eval] clients (issue 44): the distribution over the sampled clients, its plot and the split's
    sizes, as docs/guide.md shows them."""
    result = runpy.run_path(str(REPO / "examples" / "client_eval.py"), run_name="__main__")["result"]
    for row in result.metrics:
        values = sorted(row["client_accuracy_by_client"].values())
        assert row["eval_clients"] == len(values) == 10
        assert row["client_accuracy_min"] == values[0] and row["client_accuracy_max"] == values[-1]
        assert row["client_accuracy_p10"] <= row["client_accuracy_p50"] <= row["client_accuracy_p90"]
    partition = json.loads((result.dir / "partition.json").read_text())
    assert sum(partition["sizes"]) + sum(partition["held_out"]) == 1000
    assert sum(partition["held_out"]) >= 0.2 * 1000  # LEAF's cut keeps floor(0.8 n) for training
    assert (result.dir / "plots" / "client_distribution.png").is_file()
    assert "own held-out data" in (result.dir / "report.html").read_text()


def test_training_example(in_tmp):
    """Optimizers, schedules, mixed precision, SCAFFOLD on BatchNorm, the best model, early stopping
    and TensorBoard, as docs/guide.md shows them (issue 44)."""
    pytest.importorskip("tensorboard")
    scope = runpy.run_path(str(REPO / "examples" / "training.py"), run_name="__main__")
    result = scope["result"]
    rows = result.metrics
    kept = json.loads((result.dir / "best" / "best.json").read_text())
    assert kept["value"] == max(r["accuracy"] for r in rows) and kept["metric"] == "accuracy"
    best = scope["best"]
    with torch.no_grad():
        x, y = scope["x"][1000:], scope["y"][1000:]
        assert float((best.eval()(x).argmax(1) == y).float().mean()) == pytest.approx(kept["value"])
    assert (in_tmp / "runs" / "training-best.safetensors").is_file()
    assert any((result.dir / "tensorboard").glob("events.out.tfevents.*"))
    assert 'optimizer = "adamw"' in (result.dir / "config.toml").read_text()


def test_vision_example(in_tmp):
    """ResNet-18 from torchvision on a generated ImageFolder. torchvision's compiled ops must match
    torch's build, and PyPI serves no CPU torchvision for the CPU torch of the main environment: `make
    test` builds a second environment with a torch/torchvision pair that imports (constraints-vision.txt)
    and names its Python in TACITURN_VISION_PYTHON; the example runs there, as a user would run it."""
    python = os.environ.get("TACITURN_VISION_PYTHON")
    if python is None:
        try:
            import torchvision  # noqa: F401
        except (ImportError, RuntimeError) as error:
            pytest.skip(
                f"torchvision does not import here ({type(error).__name__}: {error}); `make test` runs it"
            )
        python = sys.executable
    python = str(REPO / python)  # a relative path names a file under the repository, not under in_tmp
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [python, str(REPO / "examples" / "vision.py")],
        cwd=in_tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [
        json.loads(line) for line in (in_tmp / "runs" / "resnet18" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["round"] for r in rows] == [0, 1, 2] and rows[-1]["failed"] == 0
    assert float(done.stdout.split()[-1]) == rows[-1]["accuracy"]

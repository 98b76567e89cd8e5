"""docs/guide.md cannot rot: every example it shows is a file in examples/, shown verbatim, and run here."""

import re
import runpy
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

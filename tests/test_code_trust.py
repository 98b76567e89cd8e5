"""Untrusted run folders run no code (issue 40): a config names code to import (model.factory,
data.factory, a loss), so `resume` and `export` of a folder that this user's taciturn did not
write on this machine (its manifest carries no MAC made with the user's key) import nothing
unless the user passes --trust-code; `report` and `compare` never import. `report` checks the
files it reads against the manifest and names one that changed."""

import hashlib
import json
import os
import shutil
import stat
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import forge_manifest, tiny_config

import taciturn
from taciturn.cli import main
from taciturn.experiments import types
from taciturn.experiments.config import to_toml, validate

MODULE = """
import pathlib
import torch
MARK = pathlib.Path({mark!r})
MARK.open("a").write("imported\\n")

def net(features=10, classes=3):
    MARK.open("a").write("called\\n")
    return torch.nn.Linear(features, classes)
"""


@pytest.fixture
def code(tmp_path, monkeypatch):
    """A module of the user's (trusty_models.net) that notes every import and call in a file."""
    folder = tmp_path / "code"
    folder.mkdir()
    mark = tmp_path / "mark"
    (folder / "trusty_models.py").write_text(MODULE.format(mark=str(mark)))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "trusty_models", raising=False)
    return mark


def _ran(mark: Path) -> bool:
    ran = mark.exists()
    mark.unlink(missing_ok=True)
    sys.modules.pop("trusty_models", None)  # the next import runs the module again
    return ran


@pytest.fixture
def factory_run(code, tmp_path):
    """A run of this user's with a model.factory, crashed after round 4 (a pristine copy beside it)."""
    config = tiny_config(model={"kind": "factory", "factory": "trusty_models:net"})
    pristine = tmp_path / "pristine"
    types.start(config, pristine, report=False, progress=False)
    assert _ran(code)
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    shutil.rmtree(run / "checkpoints" / "round_000006")
    return run


def _another_machine(monkeypatch, tmp_path) -> None:
    """The folder was written with someone else's key: it is received, not ours."""
    monkeypatch.setenv("TACITURN_KEY_DIR", str(tmp_path / "my-key"))


def test_a_run_of_mine_resumes_without_the_flag(factory_run, code, capsys):
    assert main(["resume", str(factory_run), "--quiet"]) == 0
    assert _ran(code)


def test_a_received_folder_runs_no_code_until_trusted(factory_run, code, monkeypatch, tmp_path, capsys):
    _another_machine(monkeypatch, tmp_path)
    before = (factory_run / "metrics.jsonl").read_bytes()
    assert main(["resume", str(factory_run), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "model.factory = 'trusty_models:net'" in err and "--trust-code" in err
    assert not _ran(code) and (factory_run / "metrics.jsonl").read_bytes() == before  # nothing touched
    assert main(["report", str(factory_run)]) == 0  # reading it runs nothing ...
    assert not _ran(code)
    assert main(["resume", str(factory_run), "--quiet"]) == 2  # ... and does not make it ours
    assert not _ran(code)
    assert main(["resume", str(factory_run), "--quiet", "--trust-code"]) == 0
    assert _ran(code)
    assert main(["resume", str(factory_run), "--quiet"]) == 2  # trusting once is not signing it


def _consistent_edit(run: Path, table: str, factory: str, kwargs: dict) -> None:
    """What a sender can do to a folder: edit config.toml and recompute every digest taciturn
    checks (run.json's config digest, the checkpoints' and the run's manifests): all but the MAC."""
    tree = tomllib.loads((run / "config.toml").read_text())
    tree[table] = {"dataset" if table == "data" else "kind": "factory", "factory": factory, "kwargs": kwargs}
    config = validate(tree, "<edit>")
    (run / "config.toml").write_text(to_toml(config))
    info_path = run / "run.json"
    info = json.loads(info_path.read_text())
    if "config_sha256" in info:
        dumped = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        info["config_sha256"] = hashlib.sha256(dumped.encode()).hexdigest()
        info_path.write_text(json.dumps(info))
    digest = hashlib.sha256((run / "config.toml").read_bytes()).hexdigest()
    for manifest_path in run.glob("checkpoints/round_*/manifest.json"):
        manifest = json.loads(manifest_path.read_text())
        manifest.pop("sha256")
        manifest["pinned"]["config.toml"] = digest
        manifest["sha256"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
        manifest_path.write_text(json.dumps(manifest))
    if (run / "manifest.json").exists():
        forge_manifest(run)


@pytest.mark.parametrize(
    ("table", "factory", "argument"),
    [("model", "subprocess:getoutput", "cmd"), ("data", "os:system", "command")],
)
def test_a_config_edited_to_run_a_shell_command_runs_nothing(factory_run, tmp_path, table, factory, argument):
    """`data.factory = "os:system"` and `model.factory = "subprocess:getoutput"` once ran their
    shell commands on `resume` of a folder someone sent."""
    pwned = tmp_path / "PWNED"
    _consistent_edit(factory_run, table, factory, {argument: f"touch {pwned}"})
    assert main(["resume", str(factory_run), "--quiet"]) == 2
    assert main(["export", str(factory_run), "--out", str(tmp_path / "m"), "--format", "hf"]) == 2
    assert not pwned.exists()


def test_export_builds_a_received_model_only_when_trusted(factory_run, code, monkeypatch, tmp_path):
    _another_machine(monkeypatch, tmp_path)
    with pytest.raises(taciturn.experiments.plugins.UntrustedCode, match="trust_code=True"):
        taciturn.export(factory_run, tmp_path / "hf", format="hf")
    assert not _ran(code)
    assert main(["export", str(factory_run), "--out", str(tmp_path / "m.safetensors")]) == 0
    assert not _ran(code)  # a state_dict needs no code
    trained = taciturn.experiments.export.load_model(factory_run, trust_code=True)
    assert _ran(code) and trained.weight.shape == (3, 10)


def test_compare_runs_no_code(factory_run, code, monkeypatch, tmp_path):
    _another_machine(monkeypatch, tmp_path)
    assert main(["compare", str(factory_run), str(factory_run), "--out", str(tmp_path / "cmp")]) == 0
    assert not _ran(code)


# ----- report checks what it reads against the manifest -----
@pytest.fixture
def reported(tmp_path):
    run = tmp_path / "run"
    types.start(tiny_config(), run, progress=False)
    return run


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _edit(path: Path) -> None:
    path.write_text(path.read_text().replace("rounds = 6", "rounds = 60"))


@pytest.mark.parametrize(
    ("name", "change"),
    [("ledger.csv", _cut), ("metrics.jsonl", _cut), ("partition.json", Path.unlink), ("config.toml", _edit)],
    ids=["cut-ledger", "cut-metrics", "deleted-partition", "edited-config"],
)
def test_report_names_a_file_that_changed(reported, capsys, name, change):
    """A cut ledger.csv, a deleted partition.json or an edited config.toml gave exit 0 and a
    different page."""
    page = (reported / "report.html").read_bytes()
    change(reported / name)
    assert main(["report", str(reported)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{reported / name}" in err and "Traceback" not in err
    assert (reported / "report.html").read_bytes() == page


def test_report_refuses_a_data_file_the_manifest_does_not_list(reported, capsys):
    (reported / "events.jsonl").write_text('{"round": 1, "client": 0, "event": "failed", "reason": "x"}\n')
    assert main(["report", str(reported)]) == 2
    assert "events.jsonl is not listed" in " ".join(capsys.readouterr().err.split())


# ----- the key -----
def test_the_key_is_this_users_alone_and_never_in_the_real_home(tmp_path, monkeypatch):
    from taciturn.core import signing

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TACITURN_KEY_DIR", str(tmp_path / "keys"))
    types.start(tiny_config(rounds=1), tmp_path / "run", report=False, progress=False)
    key = tmp_path / "keys" / "key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    assert list(home.iterdir()) == []
    tag = signing.mac(b"x")
    assert signing.verify(b"x", tag) and not signing.verify(b"y", tag)
    os.chmod(key, 0o644)  # readable by others: it proves nothing any more
    assert not signing.verify(b"x", tag)
    with pytest.raises(signing.KeyFileError, match="chmod 600"):
        signing.mac(b"x")

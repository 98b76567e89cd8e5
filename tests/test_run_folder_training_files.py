"""The files issue 44's features write into a run folder (the best model in best/, the client-side
evaluation plot plots/client_distribution.png, TensorBoard's event files and MLflow's store) are
taciturn's files like every other (issue 40): entered in manifest.json, never written, read or
deleted through a link, removed by --overwrite only while they hold what taciturn wrote, and the
user's own files beside them are kept."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from conftest import tiny_config

from taciturn.cli import main
from taciturn.experiments import types
from taciturn.experiments.config import to_toml

PRECIOUS = b"the user's own file, outside the run folder\n"
TRACKERS = all(importlib.util.find_spec(m) is not None for m in ("tensorboard", "mlflow"))
FEATURES = {
    "checkpoint": {"every": 2, "keep": 3, "best": "accuracy"},
    "eval": {"every": 1, "clients": 0.5},
    **({"tracking": {"tensorboard": True, "mlflow": True}} if TRACKERS else {}),
}
BEST = ("best/model.safetensors", "best/best.json", "best/manifest.json")
PLOT = "plots/client_distribution.png"
needs_trackers = pytest.mark.skipif(not TRACKERS, reason="the tensorboard and mlflow extras")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run with the best model, client-side evaluation and both trackers, and a config
    without them beside it (what `run --overwrite` replaces the run with)."""
    out = tmp_path_factory.mktemp("training-files") / "run"
    types.start(tiny_config(**FEATURES), out, progress=False)
    (out.parent / "plain.toml").write_text(to_toml(tiny_config()))
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A copy that crashed after round 4's checkpoint: resuming it writes the best model, the plots
    and the trackers' files again."""
    shutil.copytree(finished, tmp_path / "run")
    shutil.copy(finished.parent / "plain.toml", tmp_path / "plain.toml")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "round_000006")
    return tmp_path / "run"


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _event_files(run: Path) -> list[str]:
    return sorted(f"tensorboard/{p.name}" for p in (run / "tensorboard").iterdir())


def test_the_manifest_lists_them_with_their_digests(finished):
    files, folders = _manifest(finished)["files"], set(_manifest(finished)["folders"])
    for name in (*BEST, PLOT):
        assert "sha256" in files[name], name
    assert "best" in folders
    if TRACKERS:
        assert "tensorboard" in folders and _event_files(finished)
        for name in (*_event_files(finished), "mlflow.db"):
            assert "sha256" in files[name], name


def test_overwrite_removes_them_while_unchanged_and_keeps_the_users_files_beside_them(run, tmp_path):
    ours = [*BEST, PLOT, *((*_event_files(run), "mlflow.db") if TRACKERS else ())]
    mine = {"best/notes.txt": b"my notes", "plots/my_figure.png": b"my figure"}
    if TRACKERS:
        mine["tensorboard/my_events.txt"] = b"my events"
    for name, data in mine.items():
        (run / name).write_bytes(data)
    assert main(["run", str(tmp_path / "plain.toml"), "--out", str(run), "--overwrite", "--quiet"]) == 0
    for name in ours:
        assert not (run / name).exists(), f"--overwrite left {name}"
    for name, data in mine.items():
        assert (run / name).read_bytes() == data, f"--overwrite touched {name}"
    listed = _manifest(run)["files"]
    assert not [name for name in listed if name.startswith(("best/", "tensorboard/")) or name == PLOT]


@pytest.mark.parametrize("name", [BEST[0], BEST[1], PLOT])
def test_one_changed_since_taciturn_wrote_it_is_neither_deleted_nor_written_over(run, tmp_path, capsys, name):
    (run / name).write_bytes((run / name).read_bytes() + b"my edit")
    changed = (run / name).read_bytes()
    for command in (
        ["run", str(tmp_path / "plain.toml"), "--out", str(run), "--overwrite", "--quiet"],
        ["resume", str(run), "--quiet"],
    ):
        capsys.readouterr()
        assert main(command) == 2, command
        err = " ".join(capsys.readouterr().err.split())
        assert f"{run / name} changed since taciturn wrote it" in err and "Traceback" not in err
        assert (run / name).read_bytes() == changed


def test_resume_writes_them_again_through_the_manifest(run):
    """Resuming the crashed copy rewrites best/, the plot and the trackers' files; the manifest
    then holds their digests as they are, so a later --overwrite knows them as taciturn's."""
    assert main(["resume", str(run), "--quiet"]) == 0
    listed = _manifest(run)["files"]
    names = [*BEST, PLOT, *((*_event_files(run), "mlflow.db") if TRACKERS else ())]
    for name in names:
        data = (run / name).read_bytes()
        assert listed[name]["bytes"] == len(data), name
    assert main(["run", str(run.parent / "plain.toml"), "--out", str(run), "--overwrite", "--quiet"]) == 0
    assert not any((run / name).exists() for name in names)


LINKS = [
    ("best", True),
    ("best/model.safetensors", False),
    ("best/best.json", False),
    (PLOT, False),
    pytest.param("tensorboard", True, marks=needs_trackers),
    pytest.param("mlflow.db", False, marks=needs_trackers),
]


@pytest.mark.parametrize(("name", "folder"), LINKS)
def test_a_link_in_their_place_is_refused_by_name_and_its_target_is_untouched(
    run, tmp_path, capsys, name, folder
):
    outside = tmp_path / "outside"
    outside.mkdir()
    if folder:
        victim = outside / "Pictures"
        victim.mkdir()
        for file in ("model.safetensors", "best.json", "events.out.tfevents.1", "holiday.png"):
            (victim / file).write_bytes(PRECIOUS)
    else:
        victim = outside / "x.db"
        victim.write_bytes(PRECIOUS)
    before = {p.name: p.read_bytes() for p in sorted(victim.iterdir())} if folder else victim.read_bytes()
    path = run / name
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(victim)
    for command in (
        ["resume", str(run), "--quiet"],
        ["report", str(run)],
        ["export", str(run), "--best", "--out", str(tmp_path / "best.safetensors")],
        ["run", str(tmp_path / "plain.toml"), "--out", str(run), "--overwrite", "--quiet"],
    ):
        capsys.readouterr()
        code = main(command)
        err = " ".join(capsys.readouterr().err.split())
        assert "Traceback" not in err, (command, err)
        after = {p.name: p.read_bytes() for p in sorted(victim.iterdir())} if folder else victim.read_bytes()
        assert after == before, f"{command[0]} changed what {name} points at"
        assert path.is_symlink(), f"{command[0]} removed the link {name}"
        if command[0] != "export" or name.startswith("best"):  # (export --best reads best/ only)
            assert code == 2 and str(run / name) in err, (command, err)

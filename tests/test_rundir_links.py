"""No file operation follows a link out of a run folder (issue 40): a run folder received from
someone else, or changed behind taciturn's back, holds links where taciturn keeps its own files;
`resume`, `report` and `run --overwrite` must refuse them, naming the link, and leave what they point
at untouched. Also: a second name (hard link) is not written through, `export` does not write through
a link, and a full disk names the file."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_config

from taciturn.cli import main
from taciturn.experiments import types
from taciturn.experiments.config import to_toml
from taciturn.report.rundir import RunDir

PRECIOUS = b"the user's own file, outside the run folder\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished SCAFFOLD run whose client states live on disk (client_state.bin), with its report."""
    out = tmp_path_factory.mktemp("links") / "run"
    config = tiny_config(algorithm__name="scaffold", engine__store="disk")
    types.start(config, out, progress=False)
    (out.parent / "config.toml").write_text(to_toml(config))
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A copy that crashed after round 4's checkpoint: resuming it writes every kind of file."""
    shutil.copytree(finished, tmp_path / "run")
    shutil.copy(finished.parent / "config.toml", tmp_path / "config.toml")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "round_000006")
    return tmp_path / "run"


def _victim(outside: Path, folder: bool) -> Path:
    """What a link points at: a file of the user's, or a folder of their pictures."""
    outside.mkdir()
    if not folder:
        (outside / "x.db").write_bytes(PRECIOUS)
        return outside / "x.db"
    pictures = outside / "Pictures"
    pictures.mkdir()
    for name in ("holiday.png", "accuracy_vs_round.png", "server.safetensors", "notes.txt"):
        (pictures / name).write_bytes(PRECIOUS)
    return pictures


def _snapshot(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


LINKS = [
    ("client_state.bin", False),
    ("client_state.layout.json", False),
    ("report.html", False),
    ("run.log", False),
    ("metrics.jsonl", False),
    ("ledger.csv", False),
    ("partition.json", False),
    ("run.json", False),
    ("config.toml", False),
    ("manifest.json", False),
    ("plots", True),
    ("checkpoints", True),
    ("plots/accuracy_vs_round.png", False),
    ("checkpoints/round_000004/server.safetensors", False),
]


@pytest.mark.parametrize(("name", "folder"), LINKS, ids=[n for n, _ in LINKS])
def test_a_link_in_the_run_folder_is_refused_by_name_and_its_target_is_untouched(
    run, tmp_path, capsys, name, folder
):
    victim = _victim(tmp_path / "outside", folder)
    before = _snapshot(victim)
    path = run / name
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.symlink_to(victim)
    refused = []
    for command in (
        ["resume", str(run), "--quiet"],
        ["report", str(run)],
        ["run", str(tmp_path / "config.toml"), "--out", str(run), "--overwrite", "--quiet"],
    ):
        capsys.readouterr()
        code = main(command)
        err = capsys.readouterr().err
        assert code in (0, 2) and "Traceback" not in err, (command, err)
        assert _snapshot(victim) == before, f"{command[0]} changed what {name} points at"
        assert path.is_symlink(), f"{command[0]} removed the link {name}"
        if code == 2:
            refused.append(" ".join(err.split()))
    # at least one command needs the file, and its error names the link
    assert any(name.split("/")[0] in message for message in refused), refused


def test_a_second_name_of_a_user_file_is_not_written_through(run, tmp_path, capsys):
    """client_state.bin hard-linked to the user's file: opening it with O_TRUNC once emptied both."""
    victim = _victim(tmp_path / "outside", folder=False)
    if (run / "client_state.bin").exists():  # the same bytes: only its second name gives it away
        shutil.copy(run / "client_state.bin", victim)
    before = victim.read_bytes()
    (run / "client_state.bin").unlink(missing_ok=True)
    os.link(victim, run / "client_state.bin")
    assert main(["resume", str(run), "--quiet"]) == 2
    assert "client_state.bin has 2 names" in capsys.readouterr().err
    assert victim.read_bytes() == before


def test_export_never_writes_through_a_link(finished, tmp_path):
    victim = _victim(tmp_path / "outside", folder=False)
    out = tmp_path / "model.safetensors"
    out.symlink_to(victim)
    assert main(["export", str(finished), "--out", str(out), "--overwrite"]) == 2
    assert victim.read_bytes() == PRECIOUS and out.is_symlink()
    dangling = tmp_path / "dangling.safetensors"
    dangling.symlink_to(tmp_path / "outside" / "new.safetensors")
    assert main(["export", str(finished), "--out", str(dangling)]) == 2
    assert not (tmp_path / "outside" / "new.safetensors").exists()


def test_a_link_in_a_comparison_folder_is_refused(finished, tmp_path):
    victim = _victim(tmp_path / "outside", folder=False)
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "report.html").symlink_to(victim)
    assert main(["compare", str(finished), "--out", str(out)]) == 2
    assert victim.read_bytes() == PRECIOUS


def test_the_folder_api_refuses_links_on_every_component(tmp_path):
    """core/folder.py, the one module every writer goes through."""
    from taciturn.core.folder import Folder, FolderError

    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "up").symlink_to(outside)
    (root / "real" / "f").symlink_to(outside / "f")
    fs = Folder(root)
    for bad in ("up/x", "real/f", "up"):
        with pytest.raises(FolderError, match="symbolic link"):
            fs.write_bytes(bad, b"x") if bad != "up" else fs.mkdir("up/x")
    for leaving in ("../x", "/etc/passwd", "real/../../x"):
        with pytest.raises(FolderError, match="not a path inside"):
            fs.read_bytes(leaving)
    assert list(outside.iterdir()) == []
    os.mkfifo(root / "fifo")
    with pytest.raises(FolderError, match="not a regular"):
        fs.read_bytes("fifo")  # opened without blocking, then refused


def test_a_full_disk_names_the_file_inside_the_folder_api(tmp_path):
    from taciturn.core.folder import Folder, FolderError

    fs = Folder(tmp_path)
    full = pytest.raises(FolderError, match=r"no space left on the disk while writing .*metrics\.jsonl")
    with full, fs.open("metrics.jsonl", "a") as f:
        f.write("{}\n")
        raise OSError(28, "No space left on device")  # what a write on a full disk raises


def test_a_run_on_a_full_disk_ends_in_one_line_naming_the_file(tmp_path):
    """A real full disk: a 160 KiB tmpfs in a private mount namespace (skipped where that is not allowed)."""
    config = tmp_path / "c.toml"
    config.write_text(to_toml(tiny_config(rounds=3)))
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (
        f"mount -t tmpfs -o size=160k tmpfs {disk} || exit 77; "
        f"{sys.executable} -m taciturn.cli run {config} --out {disk}/run --quiet"
    )
    try:
        done = subprocess.run(
            ["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=300
        )
    except FileNotFoundError:
        pytest.skip("no unshare")
    if done.returncode == 77 or "unshare:" in done.stderr:
        pytest.skip("mounting a tmpfs is not allowed here")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    message = " ".join(done.stderr.split())
    assert "no space left on the disk while writing" in message and f"{disk}/run/" in message


def test_reading_a_run_never_follows_a_link_either(run, tmp_path):
    """report.html would show a linked file's contents (config.toml -> ~/.ssh/config) to whoever
    reads the page: reading is refused as writing is."""
    secret = tmp_path / "secret"
    secret.write_text('type = "federated"\nname = "secret"\nseed = 0\n')
    (run / "config.toml").unlink()
    (run / "config.toml").symlink_to(secret)
    rundir = RunDir(run)
    with pytest.raises(OSError, match=r"config\.toml"):
        rundir.read_text(rundir.config)

"""The run directory is the user's: nothing deleted without --overwrite, names that stay one folder,
crash leftovers (temporary checkpoints, torn lines) handled on resume, one writer at a time, and
checkpoints verified by digest."""

import hashlib
import json
import logging
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import forge_manifest, tiny_config

from taciturn.cli import main
from taciturn.core.codec import decode, encode
from taciturn.core.message import Message
from taciturn.experiments import checkpoint, types
from taciturn.experiments.checkpoint import MANIFEST, CheckpointError
from taciturn.experiments.config import ConfigError, load_config, to_toml
from taciturn.report.rundir import RunDir, RunDirError


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished tiny run (6 rounds, checkpoints at rounds 4 and 6), copied by each test."""
    out = tmp_path_factory.mktemp("finished") / "run"
    types.start(tiny_config(), out, report=False, progress=False)
    return out


@pytest.fixture
def run(finished, tmp_path):
    shutil.copytree(finished, tmp_path / "run")
    return RunDir(tmp_path / "run")


def _numbers(rundir: RunDir) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rundir.read_metrics()]


def _crash_after_round_4(run: RunDir) -> None:
    shutil.rmtree(run.checkpoint_dir(6))


# ----- nothing deleted without --overwrite; only taciturn's files with it -----
def test_a_folder_of_other_files_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "mine"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "thesis.png").write_bytes(b"mine")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="not empty and is not a taciturn run"):
        types.start(tiny_config(), out, progress=False)
    assert (out / "plots" / "thesis.png").read_bytes() == b"mine"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "plots"]


def test_overwrite_replaces_only_the_files_taciturn_writes(run):
    (run.plots / "thesis.png").parent.mkdir(exist_ok=True)
    (run.path / "notes.txt").write_text("mine")
    (run.checkpoints / "keep-me").mkdir()
    with pytest.raises(RunDirError, match="already holds a run"):
        types.start(tiny_config(), run.path, report=False, progress=False)
    types.start(tiny_config(rounds=2), run.path, report=False, progress=False, overwrite=True)
    assert (run.path / "notes.txt").read_text() == "mine" and (run.checkpoints / "keep-me").is_dir()
    assert [r.name for r in sorted(run.checkpoints.glob("round_*"))] == ["round_000002"]
    assert run.read_metrics()[-1]["round"] == 2


def test_cli_refuses_a_foreign_folder_with_one_clean_line(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(to_toml(tiny_config()))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.html").write_text("the demo's comparison")
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "not a taciturn run" in err
    assert (tmp_path / "out" / "report.html").read_text() == "the demo's comparison"


@pytest.mark.parametrize("name", ["../x", "/abs/x", "a/b", "..", "a\nb", "a\x00b", "tab\there", " lead"])
def test_run_names_are_one_plain_folder(name):
    with pytest.raises(ConfigError, match=r"\[name\]"):
        tiny_config(name=name)


def test_every_valid_name_round_trips_through_config_toml(tmp_path):
    config = tiny_config(name='quote" \'single\' é ☃ #x [y] = """z')
    (tmp_path / "c.toml").write_text(to_toml(config))
    assert load_config(tmp_path / "c.toml") == config


# ----- crash leftovers -----
def test_a_leftover_temporary_checkpoint_is_ignored_and_removed(run, finished):
    _crash_after_round_4(run)

    def crash(tmp):  # a process killed while it wrote round 6's checkpoint
        tmp.write_bytes("server.safetensors", b"half")
        raise KeyboardInterrupt

    with run.lock(), pytest.raises(KeyboardInterrupt):
        checkpoint.commit(run.checkpoint_dir(6), crash, run)
    tmp = run.checkpoints / "round_000006.tmp"
    assert (tmp / "server.safetensors").read_bytes() == b"half"
    types.resume(run.path, report=False, progress=False)
    assert not tmp.exists()
    assert _numbers(run) == _numbers(RunDir(finished))


@pytest.mark.parametrize("file", ["metrics.jsonl", "ledger.csv", "events.jsonl"])
def test_a_torn_last_line_is_cut_on_resume(run, finished, file, caplog):
    _crash_after_round_4(run)
    with run.lock():  # taciturn makes the file (this run had no events) ...
        run.fs.append_text(file, "")
    with (run.path / file).open("a") as f:  # ... and is killed in the middle of a line
        f.write('{"round": 5, "accur' if file.endswith("jsonl") else "5,3,u")
    with caplog.at_level(logging.WARNING, logger="taciturn"):
        types.resume(run.path, report=False, progress=False)
    assert "torn last line" in caplog.text
    assert _numbers(run) == _numbers(RunDir(finished))
    assert (run.ledger).read_text() == (RunDir(finished).ledger).read_text()


@pytest.mark.parametrize("file", ["metrics.jsonl", "ledger.csv", "config.toml"])
def test_a_run_file_edited_before_the_checkpoint_is_a_clean_error(run, file):
    """A digit changed in a row the checkpoint covers (or in the config) would silently change the
    resumed run's totals: the checkpoint's manifest catches it."""
    _crash_after_round_4(run)
    path = run.path / file
    text = path.read_text()
    at = next(i for i, c in enumerate(text) if c in "123456789" and i > 40)
    path.write_text(text[:at] + str(int(text[at]) % 9 + 1) + text[at + 1 :])
    with pytest.raises(
        RunDirError, match=file.replace(".", r"\.")
    ):  # a CheckpointError, or the config's digest
        types.resume(run.path, report=False, progress=False)


# ----- one writer at a time -----
LOCKER = """
import sys
from taciturn.report.rundir import RunDir
with RunDir(sys.argv[1]).lock():
    print("locked", flush=True)
    sys.stdin.read()  # held until the test closes our stdin
"""


def test_a_second_process_is_refused_even_after_the_lock_file_is_unlinked(run):
    """The lock was a file: unlinking it while a run wrote let a second `run --overwrite` start, and
    both appended to metrics.jsonl. It is the folder's own lock now: two real processes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(run.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline().strip() == b"locked"
        for leftover in run.path.glob(".taciturn*"):
            leftover.unlink()  # what once bypassed the lock
        before = run.metrics.read_bytes()
        with pytest.raises(RunDirError, match="in use by another taciturn process"):
            types.start(tiny_config(rounds=2), run.path, overwrite=True, report=False, progress=False)
        with pytest.raises(RunDirError, match="in use by another taciturn process"):
            types.resume(run.path, report=False, progress=False)
        assert main(["report", str(run.path)]) == 2
        assert run.metrics.read_bytes() == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    types.resume(run.path, report=False, progress=False)  # released when the holder ended


# ----- verified checkpoints -----
@pytest.mark.parametrize("file", ["server.safetensors", "clients.safetensors", "progress.json", MANIFEST])
def test_every_tampered_checkpoint_file_is_a_clean_error_naming_it(run, file):
    _crash_after_round_4(run)
    path = run.checkpoint_dir(4) / file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    before = run.metrics.read_bytes()
    with pytest.raises(CheckpointError, match=file if file != MANIFEST else MANIFEST):
        types.resume(run.path, report=False, progress=False)
    assert run.metrics.read_bytes() == before  # nothing truncated on the way to the error


def test_a_missing_manifest_is_an_error_not_a_silent_resume(run):
    _crash_after_round_4(run)
    (run.checkpoint_dir(4) / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=r"no readable manifest\.json"):
        types.resume(run.path, report=False, progress=False)


def test_a_state_of_another_shape_is_refused_even_with_a_matching_digest(run):
    _crash_after_round_4(run)
    folder = run.checkpoint_dir(4)
    message = decode((folder / "server.safetensors").read_bytes())
    wider = {name: np.zeros((a.shape[0] + 1, *a.shape[1:]), a.dtype) for name, a in message.arrays.items()}
    (folder / "server.safetensors").write_bytes(encode(Message(arrays=wider, meta=message.meta)))
    manifest = json.loads((folder / MANIFEST).read_text())
    entry = manifest["files"]["server.safetensors"]
    entry["sha256"] = hashlib.sha256((folder / "server.safetensors").read_bytes()).hexdigest()
    entry["bytes"] = (folder / "server.safetensors").stat().st_size
    del manifest["sha256"]
    manifest["sha256"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="does not fit this run's config"):
        types.resume(run.path, report=False, progress=False)


# ----- the report escapes every field and refuses what is not a number -----
def test_the_report_escapes_a_tampered_partition(run):
    part = json.loads(run.partition.read_text())
    part["kind"] = "<script>alert(1)</script>"
    part["source"] = "<img src=x onerror=alert(2)>"
    run.partition.write_text(json.dumps(part))
    forge_manifest(run.path)
    page = types.report(run).read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page


@pytest.mark.parametrize("value", ['"<script>x</script>"', "true", "null", "[1]"])
def test_a_non_numeric_metric_is_a_clean_report_error(run, value, capsys):
    lines = run.metrics.read_text().splitlines()
    lines[2] = lines[2].replace('"accuracy": ', f'"accuracy": {value}, "was": ', 1)
    run.metrics.write_text("\n".join(lines) + "\n")
    forge_manifest(run.path)
    assert main(["report", str(run.path)]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl line 3: accuracy is" in err and "Traceback" not in err
    assert not run.report.exists() or "<script>x" not in run.report.read_text()


@pytest.mark.parametrize("num_clients", ['"8<b>"', "-1", "1.5"])
def test_a_partition_with_bad_counts_is_a_clean_report_error(run, num_clients):
    text = run.partition.read_text()
    run.partition.write_text(text.replace('"num_clients": 8', f'"num_clients": {num_clients}'))
    forge_manifest(run.path)
    with pytest.raises(RunDirError, match=r"partition\.json is damaged"):
        types.report(run)


def test_compare_and_demo_refuse_a_folder_of_other_files(run, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.html").write_text("my own page")
    (mine / "notes.txt").write_text("mine")
    assert main(["compare", str(run.path), "--out", str(mine)]) == 2
    assert main(["demo", "--out", str(mine), "--quiet"]) == 2
    assert (mine / "report.html").read_text() == "my own page"
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "report.html"]
    ok = tmp_path / "cmp"
    assert main(["compare", str(run.path), str(run.path), "--out", str(ok)]) == 0
    assert main(["compare", str(run.path), str(run.path), "--out", str(ok)]) == 0  # its own files: fine


@pytest.mark.parametrize("file", ["clients/slots.bin", "clients/layout.json", "clients/present.npy"])
def test_tampered_disk_client_states_are_refused(tmp_path, file):
    """Random bytes in a disk store's slots, or a changed layout, once resumed silently."""
    config = tiny_config(algorithm__name="scaffold", engine__store="disk", rounds=4)
    run = RunDir(tmp_path / "run")
    types.start(config, run.path, report=False, progress=False)
    shutil.rmtree(run.checkpoint_dir(4))
    path = run.checkpoint_dir(2) / file
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x7F
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=file):
        types.resume(run.path, report=False, progress=False)


def test_a_fedq_run_refuses_an_edited_mdp(tmp_path):
    from taciturn.experiments.config import validate
    from taciturn.experiments.fedq import FedQRunConfig
    from taciturn.report.fedq import MDP_FILE

    tree = {"type": "fedq", "name": "q", "agents": 2, "episodes": 40, "checkpoint": {"every": 2}}
    config = validate(tree, "<test>", FedQRunConfig)
    run = RunDir(tmp_path / "q")
    types.start(config, run.path, report=False, progress=False)
    path = run.path / MDP_FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=MDP_FILE):
        types.resume(run.path, report=False, progress=False)


def test_a_damaged_bandits_run_is_a_clean_report_error(tmp_path, capsys):
    from taciturn.experiments.bandits_config import BanditsConfig
    from taciturn.experiments.config import validate

    tree = {"type": "bandits", "name": "b", "repetitions": 1, "horizon": 40, "record_every": 20}
    tree["environment"] = {"num_agents": 3, "num_arms": 4, "dim": 2, "num_clusters": 1}
    run = RunDir(tmp_path / "b")
    types.start(validate(tree, "<test>", BanditsConfig), run.path, report=False, progress=False)
    lines = run.metrics.read_text().splitlines()
    lines[-1] = lines[-1].replace('"regret": [', '"regret": ["x", ', 1)
    run.metrics.write_text("\n".join(lines) + "\n")
    forge_manifest(run.path)
    assert main(["report", str(run.path)]) == 2
    err = capsys.readouterr().err
    assert "damaged and cannot be reported" in err and "Traceback" not in err


# ----- --overwrite deletes what the manifest lists, never by pattern (issue 40) -----
def test_overwrite_keeps_a_users_files_among_taciturns(run, tmp_path):
    """Any PNG under plots/ and whole checkpoint round folders used to be deleted."""
    types.report(run)  # taciturn's plots
    (run.plots / "my_figure.png").write_bytes(b"mine")
    (run.checkpoint_dir(4) / "my_thesis_data.csv").write_text("mine")
    config = tmp_path / "c.toml"
    config.write_text(to_toml(tiny_config(rounds=2)))
    assert main(["run", str(config), "--out", str(run.path), "--overwrite", "--quiet"]) == 0
    assert (run.plots / "my_figure.png").read_bytes() == b"mine"
    assert (run.checkpoint_dir(4) / "my_thesis_data.csv").read_text() == "mine"
    assert sorted(p.name for p in run.checkpoint_dir(4).iterdir()) == [
        "my_thesis_data.csv"
    ]  # taciturn's went
    assert not run.checkpoint_dir(6).exists()
    assert run.read_metrics()[-1]["round"] == 2


@pytest.mark.parametrize("own", ["config.toml", "run.log", "metrics.jsonl", "report.html"])
def test_overwrite_never_replaces_a_file_taciturn_did_not_write(tmp_path, capsys, own):
    out = tmp_path / "mine"
    out.mkdir()
    (out / own).write_text("the user's own\n")
    config = tmp_path / "c.toml"
    config.write_text(to_toml(tiny_config(rounds=2)))
    assert main(["run", str(config), "--out", str(out), "--overwrite", "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{out / own} is not a file taciturn wrote" in err and "Traceback" not in err
    assert (out / own).read_text() == "the user's own\n"
    assert sorted(p.name for p in out.iterdir()) == [own]


def test_overwrite_of_a_folder_of_other_files_writes_beside_them(tmp_path, capsys):
    """The refusal says what --overwrite does: it deletes only what a manifest lists, so a run
    goes beside the user's files, which stay."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    config = tmp_path / "c.toml"
    config.write_text(to_toml(tiny_config(rounds=2)))
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "deletes only the files its manifest.json lists as its own" in err
    assert main(["run", str(config), "--out", str(out), "--overwrite", "--quiet"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and RunDir(out).read_metrics()[-1]["round"] == 2
    assert main(["run", str(config), "--out", str(out), "--overwrite", "--quiet"]) == 0  # its own run now
    assert (out / "notes.txt").read_text() == "mine"


# ----- resume continues only the run's own config (issue 40) -----
def _no_checkpoint(run: RunDir) -> None:
    """A run that crashed before its first checkpoint."""
    shutil.rmtree(run.checkpoints)


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("", "config.toml is empty"),  # a full disk when the run started: 0 bytes
        ("name = [", "config.toml is not valid TOML"),
        ("{}", "config.toml is not valid TOML"),
        (
            'type = "federated"\nname = "tiny"\nseed = 3\n',
            "config.toml is not the config this run was started with",
        ),
    ],
    ids=["empty", "unparsable", "braces", "defaults"],
)
def test_resume_refuses_a_config_that_is_not_the_runs(run, monkeypatch, capsys, config, says):
    """Resuming without a checkpoint starts the run again from its config: an empty config.toml
    parsed as {} once started the default experiment (Fashion-MNIST, 100 clients, 50 rounds)."""
    _no_checkpoint(run)
    run.config.write_text(config)

    def started(*args, **kwargs):
        raise AssertionError("a run was started from this config")

    monkeypatch.setattr("taciturn.experiments.runner.prepare", started)
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    assert main(["resume", str(run.path), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before


def test_resume_refuses_another_valid_config(run, monkeypatch):
    _no_checkpoint(run)
    run.config.write_text(to_toml(tiny_config(rounds=50)))
    monkeypatch.setattr("taciturn.experiments.runner.prepare", lambda *a, **k: pytest.fail("started"))
    with pytest.raises(RunDirError, match=r"config\.toml is not the config this run was started with"):
        types.resume(run.path, report=False, progress=False)


@pytest.mark.parametrize(
    "name", ["plots/accuracy_vs_round.png", "checkpoints/round_000004/server.safetensors"]
)
def test_overwrite_keeps_a_file_of_taciturns_that_the_user_changed(run, tmp_path, capsys, name):
    """A file taciturn wrote and the user wrote over since (their own figure under taciturn's
    name) may hold their work: it is neither replaced nor deleted."""
    types.report(run)
    (run.path / name).write_bytes(b"the user's own")
    config = tmp_path / "c.toml"
    config.write_text(to_toml(tiny_config(rounds=2)))
    assert main(["run", str(config), "--out", str(run.path), "--overwrite", "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{run.path / name} changed since taciturn wrote it" in err
    assert (run.path / name).read_bytes() == b"the user's own"

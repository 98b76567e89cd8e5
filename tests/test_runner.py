import itertools
import json
import subprocess
import sys

import pytest
import torch

from taciturn.cli import main
from taciturn.experiments import types
from taciturn.experiments.config import ConfigError, load_config
from taciturn.experiments.runner import resume, start
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config


def metrics_without_time(rundir: RunDir):
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rundir.read_metrics()]


def test_same_config_and_seed_give_identical_metrics_and_ledger(tmp_path):
    config = tiny_config(channel={"drop_up": 0.2, "drop_down": 0.1})
    a = start(config, tmp_path / "a", progress=False)
    b = start(config, tmp_path / "b", progress=False)
    assert metrics_without_time(a) == metrics_without_time(b)  # wall_s is the only clock reading
    assert a.ledger.read_text() == b.ledger.read_text()
    c = start(tiny_config(seed=4), tmp_path / "c", progress=False)
    assert metrics_without_time(c) != metrics_without_time(a)


class Interrupt(Exception):
    pass


def stop_after(round_to_stop):
    def callback(end):
        if end.round == round_to_stop:
            raise Interrupt

    return callback


@pytest.mark.parametrize(("stop_at", "checkpointed"), [(3, 2), (4, 4)])  # checkpoints every 2 rounds
def test_resume_ends_with_the_numbers_of_an_uninterrupted_run(tmp_path, stop_at, checkpointed):
    config = tiny_config(rounds=7, channel={"drop_up": 0.25})
    whole = start(config, tmp_path / "whole", progress=False)
    with pytest.raises(Interrupt):
        start(config, tmp_path / "cut", progress=False, callbacks=(stop_after(stop_at),))
    cut = RunDir(tmp_path / "cut")
    assert cut.latest_checkpoint()[0] == checkpointed
    assert cut.read_metrics()[-1]["round"] == stop_at  # rounds after the checkpoint are redone
    resumed = resume(tmp_path / "cut", progress=False)
    assert metrics_without_time(resumed) == metrics_without_time(whole)
    assert resumed.ledger.read_text() == whole.ledger.read_text()


def test_resume_keeps_client_state(tmp_path):
    """Client state must survive a checkpoint: a stateful algorithm's uplink depends on it."""
    import torch

    from taciturn.algorithms.fedavg import FedAvgState
    from taciturn.core.state_store import MemoryStateStore
    from taciturn.experiments import checkpoint

    store = MemoryStateStore()
    store.put(1, {"c": torch.ones(3)})
    checkpoint.save(tmp_path / "ck", FedAvgState({"w": torch.zeros(2)}), store, {"round": 5})
    back = MemoryStateStore()
    state, progress = checkpoint.load(tmp_path / "ck", FedAvgState({"w": torch.ones(2)}), back)
    assert progress == {"round": 5} and torch.equal(back.get(1)["c"], torch.ones(3))
    assert torch.equal(state.params["w"], torch.zeros(2))


def test_run_directory_has_everything_the_report_needs(tmp_path):
    rundir = types.start(tiny_config(), tmp_path / "run", progress=False)
    rows = rundir.read_metrics()
    assert [r["round"] for r in rows] == list(range(0, 7))
    required = {
        "round",
        "accuracy",
        "loss",
        "bytes_up",
        "bytes_down",
        "messages_up",
        "messages_down",
        "wall_s",
    }
    assert required <= set(rows[-1])
    assert all(
        b["bytes_up"] >= a["bytes_up"] and b["wall_s"] >= a["wall_s"] for a, b in itertools.pairwise(rows)
    )
    assert rows[-1]["messages_up"] == 6 * 4
    for png in ("accuracy_vs_round", "accuracy_vs_bytes", "bytes_per_round", "partition"):
        assert (rundir.plots / f"{png}.png").stat().st_size > 1000
    html = rundir.report.read_text()
    assert html.count("data:image/png;base64") == 4 and "Per-client class histogram" in html
    partition = json.loads(rundir.partition.read_text())
    assert sum(partition["sizes"]) == 400 and len(partition["histogram"]) == 8
    assert load_config(rundir.config) == tiny_config()  # the resolved config reproduces the run


def write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rounds = 3\n[algorithm.local]\nlrr = 0.1\n", "unknown key 'lrr': did you mean 'lr'?"),
        ("[algorithm.local]\nlr = -0.1\n", "[algorithm.local.lr] Input should be greater than 0"),
        (
            '[data]\ndataset = "fashion_mnist"\npath = "/nonexistent"\n',
            "not usable at the given path /nonexistent",
        ),
        ('[data]\ndataset = "cifar"\n', "[data.dataset] unknown value 'cifar'"),
        ("rounds = [\n", "is not valid TOML"),
    ],
)
def test_bad_configs_fail_before_training_and_the_cli_exits_nonzero(
    tmp_path, monkeypatch, capsys, text, expected
):
    monkeypatch.setattr("taciturn.data.fashion_mnist.DEBIAN_DIR", tmp_path / "none")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = write(tmp_path, text)
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 2
    assert expected in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_config_error_names_the_file(tmp_path):
    path = write(tmp_path, "[eval]\nevry = 2\n")
    with pytest.raises(ConfigError, match=str(path)):
        load_config(path)


def test_cli_set_overrides_and_refuses_to_clobber(tmp_path):
    path = write(
        tmp_path,
        'name = "x"\n[data]\ndataset = "digits"\n[partition]\nkind = "iid"\nnum_clients = 5\n'
        '[model]\nkind = "logreg"\n',
    )
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                str(path),
                "--out",
                str(out),
                "--quiet",
                "--set",
                "rounds=2",
                "--set",
                "algorithm.fraction=1.0",
            ]
        )
        == 0
    )
    assert RunDir(out).read_metrics()[-1]["round"] == 2
    assert RunDir(out).read_metrics()[-1]["messages_up"] == 10
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2  # exists: resume or --overwrite
    assert main(["compare", str(out), str(out), "--out", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "report.html").exists()


def test_cli_entry_point_runs(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "taciturn.cli", "run", str(tmp_path / "missing.toml")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "does not exist" in done.stderr


def test_embedded_demo_configs_are_valid():
    from taciturn.cli import DEMO_CONFIGS, _demo_config
    from taciturn.experiments import types

    names = [types.load(_demo_config(name)).name for name in DEMO_CONFIGS]
    assert names == ["demo-baseline", "demo-winner"]


def test_train_size_is_seeded_and_checked(tmp_path):
    from taciturn.experiments.runner import prepare

    config = tiny_config(
        data={"dataset": "digits", "train_size": 300}, partition={"kind": "iid", "num_clients": 4}
    )
    a, b = prepare(config, tmp_path), prepare(config, tmp_path)
    assert a.data.num_samples == 300
    assert torch.equal(a.data.dataset.x_train, b.data.dataset.x_train)
    with pytest.raises(ConfigError, match="train_size"):
        prepare(tiny_config(data={"dataset": "digits", "train_size": 5000}), tmp_path)

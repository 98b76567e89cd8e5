"""`taciturn run` with a FedQ config: the run directory, the report, resume, config errors."""

import csv
import json

import numpy as np
import pytest

from taciturn.cli import main
from taciturn.core import codec
from taciturn.experiments import types
from taciturn.experiments.config import ConfigError
from taciturn.report.rundir import RunDir
from taciturn.rl.mdp import random_mdp

CONFIG = """
type = "fedq"
name = "tiny"
seed = 2
agents = 3
episodes = 1500

[mdp]
states = 2
actions = 2
horizon = 2

[algorithm]
bonus = "{bonus}"

[channel]
drop_up = {drop_up}

[checkpoint]
every = 40
"""


def write(tmp_path, bonus="hoeffding", drop_up=0.0, extra=""):
    path = tmp_path / "fedq.toml"
    path.write_text(CONFIG.format(bonus=bonus, drop_up=drop_up) + extra)
    return path


def without_time(rundir):
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rundir.read_metrics()]


@pytest.mark.parametrize("bonus", ["hoeffding", "bernstein"])
def test_cli_run_writes_the_run_directory_and_report(tmp_path, capsys, bonus):
    out = tmp_path / "run"
    assert main(["run", str(write(tmp_path, bonus)), "--out", str(out), "--quiet"]) == 0
    assert "episodes per agent" in capsys.readouterr().err
    rundir = RunDir(out)
    rows = rundir.read_metrics()
    last = rows[-1]
    assert rows[0]["round"] == 0 and last["episodes"] == 1500 and last["round"] == len(rows) - 1
    assert sum(r["round_episodes"] * r["exploring"] for r in rows) == last["agent_episodes"] == 4500
    assert last["regret"] > 0 and all(r["policy_gap"] >= 0 for r in rows)
    per = 3 if bonus == "hoeffding" else 4
    assert last["scalars_up"] == last["round"] * 3 * per * 2 * 2  # M * (3 or 4) S H per round
    with rundir.ledger.open() as f:
        ledger = list(csv.DictReader(f))
    assert {int(r["round"]) for r in ledger} == set(range(1, last["round"] + 1))
    assert sum(int(r["bytes_sent"]) for r in ledger if r["direction"] == "up") == last["bytes_up"]
    for png in ("regret", "rounds", "bytes_per_round"):
        assert (rundir.plots / f"{png}.png").stat().st_size > 1000
    page = rundir.report.read_text()
    assert page.count("data:image/png;base64") == 3 and "Delta_min" in page
    mdp = codec.decode((out / "mdp.safetensors").read_bytes())
    assert np.array_equal(mdp.arrays["rewards"], random_mdp(2, 2, 2, _mdp_stream()).rewards)
    assert types.report(rundir) == rundir.report  # `taciturn report` rebuilds it from the folder


def _mdp_stream():
    from taciturn.core.rng import SERVER, Streams

    return Streams(0).numpy(0, SERVER, "mdp")


class Interrupt(Exception):
    pass


def test_resume_ends_with_the_numbers_of_an_uninterrupted_run(tmp_path):
    config = types.load(write(tmp_path, drop_up=0.2))
    whole = types.start(config, tmp_path / "whole", progress=False)

    def stop(round, row):
        if round == 95:
            raise Interrupt

    with pytest.raises(Interrupt):
        types.start(config, tmp_path / "cut", progress=False, callbacks=(stop,))
    cut = RunDir(tmp_path / "cut")
    assert cut.latest_checkpoint()[0] == 80
    resumed = types.resume(tmp_path / "cut", progress=False)
    assert without_time(resumed) == without_time(whole)
    assert resumed.ledger.read_text() == whole.ledger.read_text()
    again = types.start(config, tmp_path / "again", progress=False)
    assert without_time(again) == without_time(whole)  # same seed, same numbers


def test_a_different_seed_is_another_path_on_the_same_mdp_and_compare_overlays_them(tmp_path, capsys):
    a = types.start(types.load(write(tmp_path)), tmp_path / "a", progress=False)
    b = types.start(types.load(write(tmp_path), ["seed=3"]), tmp_path / "b", progress=False)
    assert (a.path / "mdp.safetensors").read_bytes() == (b.path / "mdp.safetensors").read_bytes()
    assert without_time(a) != without_time(b)
    assert main(["compare", str(a.path), str(b.path), "--out", str(tmp_path / "cmp")]) == 0
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert page.count("data:image/png;base64") == 1 and "Regret / sqrt(M T)" in page
    assert "compare.html" in capsys.readouterr().err
    federated = tmp_path / "fed"
    federated.mkdir()
    (federated / "config.toml").write_text('type = "federated"\nname = "x"\nseed = 0\n')
    assert main(["compare", str(a.path), str(federated), "--out", str(tmp_path / "cmp2")]) == 2
    assert "cannot compare runs of different experiment types" in capsys.readouterr().err


def test_an_mdp_of_your_own_from_a_file(tmp_path):
    mdp = random_mdp(3, 2, 2, np.random.default_rng(0))
    (tmp_path / "mine.safetensors").write_bytes(codec.encode(mdp.to_message()))
    text = CONFIG.format(bonus="hoeffding", drop_up=0.0).replace(
        "states = 2\nactions = 2\nhorizon = 2", f'kind = "file"\npath = "{tmp_path / "mine.safetensors"}"'
    )
    (tmp_path / "f.toml").write_text(text)
    rundir = types.start(types.load(tmp_path / "f.toml"), tmp_path / "run", progress=False)
    assert json.loads(rundir.metrics.read_text().splitlines()[-1])["episodes"] == 1500


@pytest.mark.parametrize(
    ("extra", "override", "expected"),
    [
        ("", ["mdp.staets=3"], "[mdp.staets] unknown key 'staets': did you mean 'states'?"),
        ("", ["agents=0"], "[agents] Input should be greater than or equal to 1"),
        ("", ["algorithm.bonus=bernstien"], "[algorithm.bonus] Input should be 'hoeffding' or 'bernstein'"),
        ("", ["channel.drop_down=1.0"], "drop_down = 1 loses every broadcast"),
        ("", ["mdp.path=/nonexistent.safetensors"], "it applies only with mdp.kind = 'file'"),
        ("", ["type=fedqq"], "unknown experiment type 'fedqq': did you mean 'fedq'?"),
    ],
)
def test_bad_fedq_configs_fail_before_any_work(tmp_path, capsys, extra, override, expected):
    path = write(tmp_path, extra=extra)
    args = ["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]
    for item in override:
        args += ["--set", item]
    assert main(args) == 2
    assert expected in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "out").exists()


def test_a_missing_mdp_file_is_named(tmp_path):
    path = write(tmp_path)
    text = path.read_text().replace(
        "states = 2\nactions = 2\nhorizon = 2", 'kind = "file"\npath = "/no/such.st"'
    )
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"/no/such\.st does not exist"):
        types.start(types.load(path), tmp_path / "out", progress=False)

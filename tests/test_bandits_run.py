"""The bandits experiment type: validated config, run directory, report, reproducibility, resume."""

import csv

import pytest

from taciturn.cli import main
from taciturn.experiments import types
from taciturn.experiments.bandits import resume, start
from taciturn.experiments.bandits_config import BanditsConfig
from taciturn.experiments.config import ConfigError, validate
from taciturn.report.rundir import RunDir


def tiny(**changes) -> BanditsConfig:
    tree = {
        "type": "bandits",
        "name": "tiny-bandits",
        "repetitions": 2,
        "horizon": 120,
        "record_every": 20,
        "environment": {"num_agents": 4, "num_arms": 5, "dim": 3, "num_clusters": 2},
        "checkpoint": {"every": 2},
        **changes,
    }
    return validate(tree, "<test>", BanditsConfig)


def without_time(rundir: RunDir) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rundir.read_metrics()]


def test_config_errors_name_the_key_and_the_fix(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('type = "bandits"\n[environment]\nnum_agent = 3\n')
    with pytest.raises(
        ConfigError, match=r"\[environment.num_agent\] unknown key 'num_agent': did you mean 'num_agents'"
    ):
        types.load(path)
    path.write_text('type = "bandit"\n')
    with pytest.raises(ConfigError, match=r"unknown experiment type 'bandit': did you mean 'bandits'"):
        types.load(path)
    with pytest.raises(ConfigError, match="oracle needs the true clusters"):
        tiny(environment={"kind": "ratings", "path": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"set \[dynucb\] num_clusters"):
        tiny(environment={"kind": "unclustered"})
    with pytest.raises(ConfigError, match="lists bass more than once"):
        tiny(methods=["bass", "bass"])
    with pytest.raises(
        ConfigError,
        match=r"\[bass.test\] Input should be 'mahalanobis', 'ellipsoid_overlap' or "
        "'ellipsoid_overlap_bandpy'",
    ):
        tiny(bass={"test": "overlap"})


def test_missing_movielens_files_fail_before_any_work(tmp_path):
    config = tiny(environment={"kind": "ratings", "path": str(tmp_path)}, methods=["bass", "independent"])
    with pytest.raises(ConfigError, match=r"lacks ratings\.csv, movies\.csv"):
        start(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_taciturn_run_writes_a_run_directory_with_plots_and_report(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        'type = "bandits"\nname = "cli"\nrepetitions = 2\nhorizon = 60\nrecord_every = 20\n'
        "[environment]\nnum_agents = 4\nnum_arms = 5\ndim = 3\n"
    )
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    rundir = RunDir(tmp_path / "run")
    rows = rundir.read_metrics()
    methods = ["bass", "independent", "pooled", "oracle", "club", "sclub", "dynucb"]
    assert [r["method"] for r in rows] == methods * 4  # records at t = 0, 20, 40, 60
    assert {len(r["regret"]) for r in rows} == {2}
    for name in ("regret_vs_time", "regret_vs_bytes", "bytes_vs_time", "f1_vs_time"):
        assert (rundir.plots / f"{name}.png").stat().st_size > 0
    assert "Cluster recovery" in rundir.report.read_text()
    with rundir.ledger.open() as f:
        ledger = list(csv.DictReader(f))
    final = {r["method"]: r for r in rows[-7:]}
    for method in methods:  # the metrics' byte counts are the ledger's, summed
        mine = [r for r in ledger if r["method"] == method and r["direction"] == "down"]
        assert sum(int(r["bytes_sent"]) for r in mine) == sum(final[method]["bytes_down"])
    assert main(["report", str(tmp_path / "run")]) == 0


def test_same_config_and_seed_give_the_same_numbers(tmp_path):
    config = tiny(channel={"drop_up": 0.1, "drop_down": 0.2})
    a = start(config, tmp_path / "a", progress=False)
    b = start(config, tmp_path / "b", progress=False)
    assert without_time(a) == without_time(b)
    assert a.ledger.read_text() == b.ledger.read_text()
    assert without_time(start(tiny(seed=5), tmp_path / "c", progress=False)) != without_time(a)


class Interrupt(Exception):
    pass


def stop_at(index):
    def callback(record, rows):
        if record == index:
            raise Interrupt

    return callback


def test_resume_ends_with_the_numbers_of_an_uninterrupted_run(tmp_path):
    config = tiny(channel={"drop_up": 0.1, "drop_down": 0.2}, checkpoint={"every": 2})
    whole = start(config, tmp_path / "whole", progress=False)
    with pytest.raises(Interrupt):
        start(config, tmp_path / "cut", progress=False, callbacks=(stop_at(3),))
    cut = RunDir(tmp_path / "cut")
    assert cut.latest_checkpoint()[0] == 2
    resumed = resume(tmp_path / "cut", progress=False)
    assert without_time(resumed) == without_time(whole)
    assert resumed.ledger.read_text() == whole.ledger.read_text()


def test_a_repetition_gives_the_same_numbers_alone_and_in_any_batch():
    """Each repetition has its own confidence radius (S from its own environment), so seed 2 runs
    identically alone, third in a batch of four and first in a batch of three: every method, every
    number, under message loss too."""
    from taciturn.experiments.bandits import build

    methods = ["independent", "pooled", "oracle", "bass", "club", "sclub", "dynucb"]
    runs = []
    for seed, repetitions, index in ((2, 1, 0), (0, 4, 2), (2, 3, 0)):
        config = tiny(
            seed=seed, repetitions=repetitions, methods=methods, channel={"drop_up": 0.1, "drop_down": 0.2}
        )
        numbers = {}
        for name, simulation in build(config).items():
            simulation.advance(config.horizon)
            row, _ = simulation.record()
            numbers[name] = {k: None if v is None else v[index] for k, v in row.items() if k != "t"}
        runs.append(numbers)
    assert runs[0]["bass"]["regret"] > 0
    assert runs[0] == runs[1] == runs[2]

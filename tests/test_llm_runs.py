"""Federated language-model runs end to end through the runner: Ferret, FedKSeed and FedAvg."""

import pytest

from taciturn.cli import main
from taciturn.experiments import types
from taciturn.experiments.config import ConfigError, validate
from taciturn.experiments.runner import resume, start
from taciturn.report.rundir import RunDir


def lm_config(algorithm: dict, **top) -> object:
    tree = {
        "name": "lm",
        "seed": 1,
        "rounds": 3,
        "data": {"dataset": "instructions", "examples_per_task": 4, "heldout": 3, "test_examples": 4},
        "partition": {"kind": "one_class", "num_clients": 20},
        "model": {
            "kind": "causal_lm",
            "hidden": 16,
            "layers": 1,
            "heads": 2,
            "max_length": 48,
            "max_new_tokens": 4,
        },
        "algorithm": {"fraction": 0.15, **algorithm},
        "eval": {"every": 1, "batch_size": 4},
        "checkpoint": {"every": 2},
        **top,
    }
    return validate(tree, "<test>")


FERRET = {"name": "ferret", "max_bases_per_block": 4, "local": {"steps": 2, "batch_size": 2, "lr": 0.05}}
FEDKSEED = {"name": "fedkseed", "seeds": 32, "local": {"steps": 3, "batch_size": 1, "lr": 1e-4}}
FEDAVG = {"name": "fedavg", "local": {"steps": 2, "batch_size": 2, "lr": 0.05}}


def per_message(rows, direction):
    last = rows[-1]
    return last[f"bytes_{direction}"] / last[f"messages_{direction}"]


def test_the_three_methods_run_on_one_task_and_ferret_sends_a_tiny_fraction_of_fedavg(tmp_path):
    runs = {
        a["name"]: types.start(lm_config(a), tmp_path / a["name"], progress=False)
        for a in (FERRET, FEDKSEED, FEDAVG)
    }
    rows = {name: run.read_metrics() for name, run in runs.items()}
    for name, metrics in rows.items():
        assert [r["round"] for r in metrics] == [0, 1, 2, 3], name
        assert {"rougeL", "accuracy", "loss"} <= set(metrics[-1]) and metrics[-1]["messages_up"] == 3 * 3
        assert metrics[-1]["rejected"] == metrics[-1]["failed"] == 0
        assert (runs[name].plots / "partition.png").exists() and runs[name].report.exists()
    assert rows["ferret"][0]["loss"] == rows["fedavg"][0]["loss"]  # the same w_0 for every method
    fedavg_up = per_message(rows["fedavg"], "up")
    assert per_message(rows["ferret"], "up") < fedavg_up / 20
    assert per_message(rows["fedkseed"], "up") < fedavg_up / 20
    assert per_message(rows["ferret"], "down") < per_message(rows["fedavg"], "down") / 20


def test_a_resumed_ferret_run_ends_with_the_numbers_of_an_uninterrupted_one(tmp_path):
    config = lm_config(FERRET, rounds=4, channel={"drop_up": 0.3})

    class Stop(Exception):
        pass

    def stop_at_3(end):
        if end.round == 3:
            raise Stop

    whole = start(config, tmp_path / "whole", progress=False)
    with pytest.raises(Stop):
        start(config, tmp_path / "cut", progress=False, callbacks=(stop_at_3,))
    resumed = resume(tmp_path / "cut", progress=False)

    def strip(rundir: RunDir):
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in rundir.read_metrics()]

    assert strip(resumed) == strip(whole)
    assert resumed.ledger.read_text() == whole.ledger.read_text()


def test_language_model_configs_fail_early_with_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="go together"):
        validate({"model": {"kind": "causal_lm"}}, "<test>")
    with pytest.raises(ConfigError, match=r"set data\.path"):
        validate(
            {"data": {"dataset": "instructions", "source": "dolly"}, "model": {"kind": "causal_lm"}}, "<test>"
        )
    with pytest.raises(ConfigError, match="must divide"):
        validate(
            {"data": {"dataset": "instructions"}, "model": {"kind": "causal_lm", "hidden": 10, "heads": 4}},
            "<t>",
        )
    path = tmp_path / "c.toml"
    path.write_text('[data]\ndataset = "instructions"\nheldout = 99\n[model]\nkind = "causal_lm"\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    path.write_text(
        '[data]\ndataset = "instructions"\n[model]\nkind = "causal_lm"\nsource = "gguf"\npath = "/no.gguf"\n'
    )
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2

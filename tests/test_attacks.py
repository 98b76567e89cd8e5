"""Simulated attackers: exact forgeries, seeded choice, and runs that survive every attack."""

import math

import numpy as np
import pytest
import torch

from taciturn.attacks.config import AttackConfig
from taciturn.attacks.label_flip import flip_labels
from taciturn.attacks.poisoning import ModelPoisoning, lie_z, pick_attackers
from taciturn.core import Message
from taciturn.core.rng import Streams
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import prepare, start
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config


def uplink(values, n=5):
    return Message({"w": np.array(values, np.float32), "seed": np.array([3], np.int32)}, {"num_samples": n})


def forge(kind, uplinks, attackers, strength=None, round=1):
    poisoning = ModelPoisoning(
        AttackConfig(kind=kind, fraction=0.5, strength=strength), attackers, Streams(0)
    )
    return dict(poisoning.forge(round, list(enumerate(uplinks))))


def test_attackers_are_a_seeded_fraction_of_all_clients():
    a = pick_attackers(0.2, 50, Streams(1))
    assert (
        len(a) == 10 and a == pick_attackers(0.2, 50, Streams(1)) and a != pick_attackers(0.2, 50, Streams(2))
    )
    assert pick_attackers(0.0, 50, Streams(1)) == frozenset()


def test_sign_flip_scale_and_weight_lie_forge_exactly_what_they_say():
    ups = [uplink([1.0, -2.0]), uplink([3.0, 4.0])]
    out = forge("sign_flip", ups, frozenset({1}), strength=10.0)
    assert out[0] is ups[0]
    np.testing.assert_array_equal(out[1].arrays["w"], np.array([-30.0, -40.0], np.float32))
    np.testing.assert_array_equal(out[1].arrays["seed"], ups[1].arrays["seed"])  # integers untouched
    out = forge("scale", ups, frozenset({0}), strength=1e3)
    np.testing.assert_array_equal(out[0].arrays["w"], np.array([1e3, -2e3], np.float32))
    assert out[0].arrays["w"].dtype == np.float32
    lie = forge("weight_lie", ups, frozenset({0}))
    assert lie[0].meta["num_samples"] == 10**12 and lie[1].meta["num_samples"] == 5


def test_gaussian_noise_is_seeded_per_round_and_client_with_the_given_std():
    big = [uplink(np.zeros(20000))]
    a = forge("gaussian", big, frozenset({0}), strength=3.0)[0].arrays["w"]
    b = forge("gaussian", big, frozenset({0}), strength=3.0)[0].arrays["w"]
    c = forge("gaussian", big, frozenset({0}), strength=3.0, round=2)[0].arrays["w"]
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.std() == pytest.approx(3.0, rel=0.03)


def test_a_little_is_enough_sends_mu_minus_z_sigma():
    # Baruch et al. 2019, Alg. 3 with n = 10, f = 2: s = floor(10/2 + 1) - 2 = 4, z = Phi^-1(0.6) = 0.2533
    assert lie_z(10, 2) == pytest.approx(0.253347, abs=1e-6)
    assert lie_z(50, 10) == pytest.approx(0.467699, abs=1e-6)  # s = 26 - 10 = 16, Phi^-1(34/50 = 0.68)
    ups = [uplink([0.0]), uplink([2.0]), uplink([4.0]), uplink([10.0])]
    out = forge("little_is_enough", ups, frozenset({2, 3}), strength=1.5)
    mu, sigma = 4.0, math.sqrt((16 + 4 + 0 + 36) / 4)
    for c in (2, 3):
        np.testing.assert_allclose(out[c].arrays["w"], [mu - 1.5 * sigma], rtol=1e-6)
    assert out[0] is ups[0] and out[1] is ups[1]


def test_label_flip_flips_only_the_attackers_labels(tmp_path):
    exp = prepare(tiny_config(), tmp_path)
    data = exp.data
    flipped = flip_labels(data, frozenset({2, 5}))
    y, y2 = data.dataset.y_train, flipped.dataset.y_train
    for c in range(8):
        idx = torch.from_numpy(data.client_indices(c))
        want = 2 - y[idx] if c in (2, 5) else y[idx]  # 3 classes: y -> 2 - y
        assert torch.equal(y2[idx], want)
    assert not torch.equal(y, y2)  # the original is untouched


def test_colluding_attackers_refuse_parallel_workers():
    with pytest.raises(ConfigError, match="every honest update"):
        tiny_config(attack={"kind": "little_is_enough", "fraction": 0.2}, engine={"executor": "parallel"})


@pytest.mark.parametrize(
    ("kind", "strength"),
    [
        ("sign_flip", 10.0),
        ("scale", 1e6),
        ("gaussian", 1.0),
        ("label_flip", None),
        ("little_is_enough", None),
        ("weight_lie", 1.0),
        ("scale", 3e38),
    ],
)
def test_an_undefended_run_survives_every_attack_with_a_finite_model(tmp_path, kind, strength):
    config = tiny_config(rounds=3, attack={"kind": kind, "fraction": 0.25, "strength": strength})
    rows = start(config, tmp_path / "run", progress=False).read_metrics()
    assert len(rows) == 4 and all(math.isfinite(r["loss"]) for r in rows)


def test_the_median_resists_a_scaled_update_that_ruins_the_mean(tmp_path):
    attack = {"kind": "scale", "fraction": 0.125, "strength": 1e4}
    clean = start(tiny_config(rounds=4), tmp_path / "clean", progress=False).read_metrics()[-1]
    mean = start(tiny_config(rounds=4, attack=attack), tmp_path / "mean", progress=False).read_metrics()[-1]
    median = start(
        tiny_config(rounds=4, attack=attack, aggregation={"kind": "median"}),
        tmp_path / "median",
        progress=False,
    ).read_metrics()[-1]
    assert mean["loss"] > 10 * clean["loss"]
    assert median["loss"] < 1.5 * clean["loss"]


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_a_huge_finite_update_is_rejected_by_name_instead_of_skipping_every_round(tmp_path, name):
    """Issue 39: under the plain mean one client sending finite values of 1e37 overflowed the
    weighted sum every round, so every round was skipped and training stopped without the attacker
    being singled out. Now its update is rejected, naming it, and the others' rounds go on."""
    attack = {"kind": "gaussian", "fraction": 0.125, "strength": 1e37}  # one client of 8, every round
    config = tiny_config(rounds=3, algorithm={"name": name, "fraction": 1.0}, attack=attack)
    rundir = start(config, tmp_path / "run", progress=False)
    last = rundir.read_metrics()[-1]
    events = RunDir.read_jsonl(rundir.events)
    (attacker,) = pick_attackers(0.125, 8, Streams(config.seed))
    assert last["skipped"] == 0 and last["rejected"] == 3
    assert all(
        e["event"] == "rejected" and e["client"] == attacker and "overflow" in e["reason"] for e in events
    )
    clean = start(
        tiny_config(rounds=3, algorithm={"name": name, "fraction": 1.0}), tmp_path / "clean", progress=False
    )
    assert last["accuracy"] > clean.read_metrics()[0]["accuracy"]  # it learned from the other seven

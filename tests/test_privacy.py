"""Client-level DP: the accountant against dp-accounting for every sampling scheme, exact clipping,
noise that the public run seed cannot regenerate, and a private run's outputs."""

import json
import math
import re

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import pld, rdp

from taciturn.core import Message
from taciturn.core.params import flatten, sub
from taciturn.core.rng import SERVER, Streams
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import prepare, start
from taciturn.privacy.accountant import PLD_FLOOR, Accountant, solve_noise_multiplier
from taciturn.privacy.config import NOT_PRIVATE, PrivacyConfig
from taciturn.privacy.gaussian import GaussianSum, LocalGaussian
from taciturn.privacy.noise import GaussianNoise, standard_normal
from taciturn.server.clipping import NormBound
from taciturn.server.transform import Chain, Updates
from tests.conftest import tiny_config

REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE
SEEDED = GaussianNoise(reproducible=True)


def library_epsilon(accountant, event, rounds, delta=1e-5):
    accountant.compose(event, rounds)
    return accountant.get_epsilon(delta)


# ----- accounting -----
def test_rdp_poisson_epsilon_equals_dp_accounting_composed_by_hand():
    config = PrivacyConfig(enabled=True, noise_multiplier=1.1, delta=1e-5)
    ours = Accountant(config, 1.1, num_clients=1000, fraction=0.01, per_round=10)
    assert ours.epsilon(0) == 0.0
    reference = rdp.RdpAccountant()
    for _ in range(50):  # round by round, as a user of dp-accounting would
        reference.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)))
    assert ours.epsilon(20) < ours.epsilon(50)  # composing lazily: 20 rounds, then 30 more
    assert ours.epsilon(50) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)


def test_fixed_size_sampling_is_replace_one_with_twice_the_sensitivity():
    """Issue 39: m of N without replacement is replace-one, and replacing one update of norm <= S
    by another moves the sum by up to 2S, so the Gaussian's multiplier over the sensitivity is z/2.
    Read over S it reported 1.48 for N = 1000, m = 10, z = 1, 100 rounds; the mechanism's is 11.2."""
    config = PrivacyConfig(enabled=True, noise_multiplier=1.0, sampling="fixed")
    ours = Accountant(config, 1.0, num_clients=1000, fraction=0.01, per_round=10).epsilon(100)
    wor = dp_accounting.SampledWithoutReplacementDpEvent(1000, 10, dp_accounting.GaussianDpEvent(0.5))
    assert ours == pytest.approx(
        library_epsilon(rdp.RdpAccountant(neighboring_relation=REPLACE_ONE), wor, 100)
    )
    assert ours == pytest.approx(11.21, abs=0.01)


# (N, fraction): partial participation, every client every round, and q N = 1.5 (not an integer)
SCHEMES = [(100, 0.1), (20, 1.0), (100, 0.015)]


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize(("num_clients", "fraction"), SCHEMES)
def test_poisson_epsilon_is_never_below_dp_accountings_rdp_or_pld(accountant, num_clients, fraction):
    config = PrivacyConfig(enabled=True, noise_multiplier=1.2, accountant=accountant)
    ours = Accountant(config, 1.2, num_clients, fraction, per_round=max(1, int(fraction * num_clients)))
    event = dp_accounting.PoissonSampledDpEvent(fraction, dp_accounting.GaussianDpEvent(1.2))
    reference = {
        "rdp": library_epsilon(rdp.RdpAccountant(), event, 8),
        "pld": library_epsilon(pld.PLDAccountant(), event, 8),
    }
    assert ours.epsilon(8) == pytest.approx(reference[accountant], rel=1e-6)
    assert ours.epsilon(8) >= min(reference.values()) * (1 - 1e-9)


@pytest.mark.parametrize(("num_clients", "fraction"), SCHEMES)
def test_fixed_size_epsilon_is_never_below_dp_accountings_for_the_same_mechanism(num_clients, fraction):
    """m = floor(q N) of N without replacement, replace-one: the library's RDP for sampling without
    replacement with z / 2; with every client every round also the library's PLD for the plain
    Gaussian under replace-one, which takes the sensitivity as 2 per unit of z on its own (an
    independent check of the factor 2: it reported 4.73 where PLD gives 10.0, issue 39)."""
    config = PrivacyConfig(enabled=True, noise_multiplier=1.2, sampling="fixed")
    per_round = max(1, math.floor(fraction * num_clients + 1e-9))
    ours = Accountant(config, 1.2, num_clients, fraction, per_round).epsilon(8)
    wor = dp_accounting.SampledWithoutReplacementDpEvent(
        num_clients, per_round, dp_accounting.GaussianDpEvent(0.6)
    )
    assert ours == pytest.approx(
        library_epsilon(rdp.RdpAccountant(neighboring_relation=REPLACE_ONE), wor, 8), rel=1e-9
    )
    if per_round == num_clients:
        plain = dp_accounting.GaussianDpEvent(1.2)
        assert ours >= library_epsilon(pld.PLDAccountant(neighboring_relation=REPLACE_ONE), plain, 8)


def test_local_dp_reports_the_epsilon_of_one_participation_against_the_server():
    """Issue 39: local mode showed the central, sampling-amplified 1.21 (z = 1, q = 0.01, 100
    rounds), while one release to the server (sensitivity 2S, std z S) costs about 10."""
    config = PrivacyConfig(enabled=True, mode="local", noise_multiplier=1.0)
    ours = Accountant(config, 1.0, num_clients=1000, fraction=0.01, per_round=10)
    one = library_epsilon(rdp.RdpAccountant(), dp_accounting.GaussianDpEvent(0.5), 1)
    assert ours.epsilon(0) == 0.0 and ours.epsilon(1) == ours.epsilon(100) == pytest.approx(one)
    assert ours.epsilon(100) > 10
    pld_config = PrivacyConfig(enabled=True, mode="local", noise_multiplier=1.0, accountant="pld")
    assert Accountant(pld_config, 1.0, 1000, 0.01, 10).epsilon(5) == pytest.approx(
        library_epsilon(pld.PLDAccountant(), dp_accounting.GaussianDpEvent(0.5), 1), rel=1e-6
    )


def gaussian_multiplier(event) -> float:
    """The noise multiplier of the Gaussian inside a (composed, sampled) event."""
    while not isinstance(event, dp_accounting.GaussianDpEvent):
        event = event.event
    return event.noise_multiplier


@pytest.mark.parametrize(
    ("accountant", "sampling", "mode"),
    [
        ("rdp", "poisson", "central"),
        ("pld", "poisson", "central"),
        ("rdp", "fixed", "central"),
        ("pld", "poisson", "local"),
    ],
)
def test_the_noise_multiplier_solved_for_a_target_epsilon_spends_it(accountant, sampling, mode, monkeypatch):
    """Issue 39: with the PLD accountant the solver started at z = 1e-3 and died allocating 38 GiB;
    its bracket now comes from the RDP solution and never reaches below PLD_FLOOR."""
    asked: list[float] = []
    compose = pld.PLDAccountant.compose

    def spy(self, event, count=1):
        asked.append(event)
        return compose(self, event, count)

    monkeypatch.setattr(pld.PLDAccountant, "compose", spy)
    config = PrivacyConfig(
        enabled=True, target_epsilon=2.0, accountant=accountant, sampling=sampling, mode=mode
    )
    rounds = 100 if accountant == "rdp" else 30  # PLD composes slowly: fewer rounds, the same bracket
    z = solve_noise_multiplier(config, num_clients=1000, fraction=0.01, per_round=10, rounds=rounds)
    assert Accountant(config, z, 1000, 0.01, 10).epsilon(rounds) == pytest.approx(2.0, rel=1e-3)
    multipliers = [gaussian_multiplier(event) for event in asked]
    assert (accountant == "pld") == bool(asked) and min(multipliers, default=1) >= PLD_FLOOR / 2
    if sampling == "fixed":  # read over S, the solver gave 0.884, whose true epsilon is 13.4
        assert z > 2 * 0.884 * 0.9


def test_a_target_the_pld_accountant_cannot_reach_safely_is_refused_before_work(tmp_path):
    config = tiny_config(rounds=2, privacy={"enabled": True, "target_epsilon": 1e5, "accountant": "pld"})
    with pytest.raises(ConfigError, match="accountant = 'rdp'"):
        start(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ----- the mechanism -----
def test_every_clipped_update_is_within_the_bound_and_the_noise_has_std_z_times_clip():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 40000, generator=gen) * torch.tensor([0.001, 0.01, 1, 2, 5, 9])[:, None]
    clipped, _, _ = NormBound(0.5).update(Updates(rows, torch.ones(6, dtype=torch.float64)), {}, gen)
    assert (clipped.rows.double().norm(dim=1) <= 0.5 * (1 + 1e-6)).all()
    assert torch.equal(clipped.rows[0], rows[0])
    zeros = Updates(torch.zeros(4, 200000), torch.ones(4, dtype=torch.float64))
    for noise in (GaussianNoise(), SEEDED):
        chain = Chain([NormBound(0.5), GaussianSum(1.3, 0.5, expected_clients=4.0, noise=noise)])
        out, _, info = chain.update(zeros, {}, gen)
        noise_on_sum = out.rows[0].double() * 4.0  # the release is (sum + noise) / (q N)
        assert noise_on_sum.std().item() == pytest.approx(1.3 * 0.5, rel=0.01)
        assert abs(noise_on_sum.mean().item()) < 0.01 and info["noise_std"] == pytest.approx(0.65)


def test_the_csprng_normals_have_the_normal_distribution():
    z = standard_normal(400_001).numpy()  # odd: the last Box-Muller pair is cut
    assert len(z) == 400_001 and np.isfinite(z).all()
    # mean 0 (sd 1/sqrt(n) = 0.0016), variance 1, no skew, normal tails; bounds of 5 to 6 sd
    assert abs(z.mean()) < 0.009 and abs(z.var() - 1) < 0.012 and abs((z**3).mean()) < 0.03
    for k, tail in ((1, 0.31731), (2, 0.04550), (3, 0.00270)):
        assert abs((np.abs(z) > k).mean() - tail) < 6 * math.sqrt(tail / len(z))
    assert not np.array_equal(standard_normal(1000), standard_normal(1000))


def test_local_dp_clips_and_noises_each_clients_delta():
    local = LocalGaussian(noise_multiplier=0.0, clip=1.0, prefix="dy/", streams=Streams(0), noise=SEEDED)
    m = Message(
        {"dy/w": np.array([3.0, 4.0], np.float32), "dc/w": np.array([7.0], np.float32)}, {"num_samples": 3}
    )
    out = local.apply(1, 2, m)
    np.testing.assert_allclose(out.arrays["dy/w"], [0.6, 0.8], rtol=1e-6)
    assert out.arrays["dc/w"] is m.arrays["dc/w"] and out.meta == m.meta
    big = Message({"w": np.zeros(100000, np.float32)})
    for noise in (GaussianNoise(), SEEDED):
        noisy = LocalGaussian(2.0, 1.0, "", Streams(0), noise)
        a, b = noisy.apply(1, 2, big).arrays["w"], noisy.apply(1, 3, big).arrays["w"]
        assert a.std() == pytest.approx(2.0, rel=0.02) and not np.array_equal(a, b)
    # reproducible: from the client's own stream; private: never the same twice
    assert np.array_equal(LocalGaussian(2.0, 1.0, "", Streams(0), SEEDED).apply(1, 2, big).arrays["w"], a)
    private = LocalGaussian(2.0, 1.0, "", Streams(0), GaussianNoise())
    assert not np.array_equal(private.apply(1, 2, big).arrays["w"], private.apply(1, 2, big).arrays["w"])


def round_one_release(tmp_path, **privacy):
    """The model change of one central-DP round in which no update arrives (the release is pure
    noise / (q N)), and the run's seeded generator for that round's server chain."""
    config = tiny_config(
        model={"kind": "mlp", "hidden": [64]},  # 899 values: the noise's statistics are sharp
        algorithm={"name": "fedavg", "fraction": 0.5},
        channel={"drop_up": 1.0},
        privacy={"enabled": True, "noise_multiplier": 1.3, "clip": 0.5} | privacy,
    )
    exp = prepare(config, tmp_path)
    state = exp.algorithm.init_server(exp.task.init_params(exp.streams.torch(0, SERVER, "init")), 8)
    new, report = exp.federation.run_round(state, 1)
    assert report.accepted == []
    names = sorted(state.params)
    moved = flatten({n: sub(new.params, state.params)[n] for n in names}).double()
    return moved, exp.streams.torch(1, SERVER, "server-chain")


def test_reproducible_noise_is_the_seeded_draw_and_can_be_subtracted(tmp_path):
    moved, seeded = round_one_release(tmp_path, reproducible_noise=True)
    noise = torch.randn(moved.numel(), generator=seeded, dtype=torch.float64)
    torch.testing.assert_close(moved, (noise * 1.3 * 0.5 / 4.0).float().double(), rtol=1e-5, atol=1e-6)


def test_private_noise_cannot_be_regenerated_from_the_seed(tmp_path):
    """Issue 39's attack: regenerate the noise from the (public) seed and subtract it. With seeded
    noise the residual was 3.7e-8; now the two are independent: the residual is as large as the
    noise itself (std sqrt(2) x the release's), and so is the correlation's absence."""
    moved, seeded = round_one_release(tmp_path)
    guess = torch.randn(moved.numel(), generator=seeded, dtype=torch.float64) * 1.3 * 0.5 / 4.0
    assert moved.std().item() == pytest.approx(1.3 * 0.5 / 4.0, rel=0.1)  # still the mechanism's noise
    assert (moved - guess).std().item() > 1.2 * moved.std().item()
    assert abs(np.corrcoef(moved.numpy(), guess.numpy())[0, 1]) < 0.2
    for seed in range(20):  # and no other seed gives it either
        other = torch.randn(moved.numel(), generator=Streams(seed).torch(1, SERVER, "server-chain"))
        assert (moved - other.double() * 1.3 * 0.5 / 4.0).std().item() > 1.2 * moved.std().item()


def final_params(rundir):
    from taciturn.report.rundir import RunDir

    rows = RunDir(rundir).read_metrics()
    return [(r["loss"], r["accuracy"]) for r in rows]


@pytest.mark.parametrize("mode", ["central", "local"])
def test_two_runs_with_one_config_release_different_models_unless_noise_is_reproducible(tmp_path, mode):
    privacy = {"enabled": True, "noise_multiplier": 0.5, "mode": mode}
    a, b, c, d = (
        start(tiny_config(rounds=2, privacy=privacy | extra), tmp_path / name, progress=False).path
        for name, extra in (
            ("a", {}),
            ("b", {}),
            ("c", {"reproducible_noise": True}),
            ("d", {"reproducible_noise": True}),
        )
    )
    assert final_params(a)[-1] != final_params(b)[-1]
    assert final_params(c) == final_params(d)


# ----- what a private run releases -----
def test_a_private_run_reports_epsilon_each_round_and_says_where_its_noise_came_from(tmp_path):
    config = tiny_config(
        rounds=3,
        algorithm={"name": "fedavg", "fraction": 0.5},
        privacy={"enabled": True, "noise_multiplier": 1.0},
    )
    rundir = start(config, tmp_path / "dp", progress=False)
    rows = rundir.read_metrics()
    eps = [r["epsilon"] for r in rows]
    reference = rdp.RdpAccountant()
    reference.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1.0)), 3)
    assert eps[0] == 0.0 and eps[1] < eps[2] < eps[3]
    assert eps[3] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    assert all(math.isfinite(r["loss"]) for r in rows) and rows[1]["noise_std"] == 1.0
    from taciturn.experiments import types
    from taciturn.report.html import write_report

    report = write_report(rundir).read_text()
    assert f"epsilon = {eps[3]:.4g} after round 3" in report and "OS CSPRNG" in report
    record = json.loads(rundir.info.read_text())["privacy"]
    assert record["noise"].startswith("the OS CSPRNG") and record["neighbours"] == "add/remove-one client"
    assert types.headline(rundir).endswith(f"epsilon {eps[3]:.4g}")


def test_reproducible_noise_marks_the_run_not_private_everywhere(tmp_path):
    config = tiny_config(
        rounds=2, privacy={"enabled": True, "noise_multiplier": 1.0, "reproducible_noise": True}
    )
    rundir = start(config, tmp_path / "seeded", progress=False)
    rows = rundir.read_metrics()
    assert all(r["epsilon"] == NOT_PRIVATE for r in rows)
    assert rows[-1]["nominal_epsilon"] > 0  # what secret noise would have cost
    assert json.loads(rundir.info.read_text())["privacy"]["noise"] == NOT_PRIVATE
    assert NOT_PRIVATE in rundir.log.read_text()
    from taciturn.experiments import types
    from taciturn.report.html import write_report

    assert NOT_PRIVATE in write_report(rundir).read_text()
    assert NOT_PRIVATE.upper() in types.headline(rundir)


def test_a_private_run_releases_no_exact_client_statistic_and_names_no_client(tmp_path):
    """Issue 39: each round's exact clipped count, per-round train_loss and the ledger's per-round
    client lists were in a DP run's outputs. Central DP: the clipped count is not released, no
    client sends its train_loss, the ledger has one row per round and direction, and the events
    and the log name no client."""
    attack = {"kind": "scale", "fraction": 0.25, "strength": 3e38}  # non-finite updates: rejected
    privacy = {"enabled": True, "noise_multiplier": 1.0, "sampling": "fixed"}
    rundir = start(tiny_config(rounds=3, privacy=privacy, attack=attack), tmp_path / "dp", progress=False)
    rows = rundir.read_metrics()
    assert all("clipped" not in r and r["train_loss"] is None for r in rows)
    ledger = rundir.ledger.read_text().splitlines()[1:]
    assert ledger and all(line.split(",")[1] == "all" for line in ledger)
    assert len(ledger) == 2 * 3  # up and down, three rounds
    events = [json.loads(line) for line in rundir.events.read_text().splitlines()]
    assert events and all(e["client"] is None for e in events)
    assert not re.search(r"client \d", rundir.log.read_text())
    plain = start(tiny_config(rounds=3, attack=attack), tmp_path / "plain", progress=False)
    assert plain.read_metrics()[-1]["train_loss"] is not None  # the same run without DP reports them
    assert any(e["client"] is not None for e in map(json.loads, plain.events.read_text().splitlines()))


def test_bad_privacy_configs_fail_before_work():
    with pytest.raises(ConfigError, match="exactly one"):
        tiny_config(privacy={"enabled": True})
    with pytest.raises(ConfigError, match="leave"):
        tiny_config(privacy={"enabled": True, "noise_multiplier": 1.0}, aggregation={"kind": "median"})
    with pytest.raises(ConfigError, match="fedavg, fedprox or scaffold"):
        tiny_config(algorithm={"name": "fedadmm"}, privacy={"enabled": True, "noise_multiplier": 1.0})

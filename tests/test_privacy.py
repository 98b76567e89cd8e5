"""Client-level DP: the accountant against dp-accounting, exact clipping, the noise's std."""

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import pld, rdp

from taciturn.core import Message
from taciturn.core.rng import Streams
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import start
from taciturn.privacy.accountant import Accountant, solve_noise_multiplier
from taciturn.privacy.config import PrivacyConfig
from taciturn.privacy.gaussian import GaussianSum, LocalGaussian
from taciturn.server.clipping import NormBound
from taciturn.server.transform import Chain, Updates
from tests.conftest import tiny_config


def test_rdp_poisson_epsilon_equals_dp_accounting_composed_by_hand():
    config = PrivacyConfig(enabled=True, noise_multiplier=1.1, delta=1e-5)
    ours = Accountant(config, 1.1, num_clients=1000, fraction=0.01, per_round=10)
    assert ours.epsilon(0) == 0.0
    reference = rdp.RdpAccountant()
    for _ in range(50):  # round by round, as a user of dp-accounting would
        reference.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)))
    assert ours.epsilon(20) < ours.epsilon(50)  # composing lazily: 20 rounds, then 30 more
    assert ours.epsilon(50) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)


def test_fixed_size_sampling_uses_replace_one_neighbours():
    config = PrivacyConfig(enabled=True, noise_multiplier=2.0, sampling="fixed")
    ours = Accountant(config, 2.0, num_clients=100, fraction=0.1, per_round=10)
    reference = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    reference.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(100, 10, dp_accounting.GaussianDpEvent(2.0)), 5
    )
    assert ours.epsilon(5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)


def test_pld_epsilon_equals_dp_accounting():
    config = PrivacyConfig(enabled=True, noise_multiplier=1.0, accountant="pld")
    ours = Accountant(config, 1.0, num_clients=100, fraction=0.1, per_round=10)
    reference = pld.PLDAccountant()
    reference.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), 3)
    assert ours.epsilon(3) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)
    with pytest.raises(ValueError, match="PLD"):
        PrivacyConfig(enabled=True, noise_multiplier=1.0, accountant="pld", sampling="fixed")


def test_the_noise_multiplier_solved_for_a_target_epsilon_spends_it():
    config = PrivacyConfig(enabled=True, target_epsilon=4.0)
    z = solve_noise_multiplier(config, num_clients=100, fraction=0.1, per_round=10, rounds=10)
    assert Accountant(config, z, 100, 0.1, 10).epsilon(10) == pytest.approx(4.0, rel=1e-3)


def test_every_clipped_update_is_within_the_bound_and_the_noise_has_std_z_times_clip():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 40000, generator=gen) * torch.tensor([0.001, 0.01, 1, 2, 5, 9])[:, None]
    clipped, _, _ = NormBound(0.5).update(Updates(rows, torch.ones(6, dtype=torch.float64)), {}, gen)
    assert (clipped.rows.double().norm(dim=1) <= 0.5 * (1 + 1e-6)).all()
    assert torch.equal(clipped.rows[0], rows[0])
    zeros = Updates(torch.zeros(4, 200000), torch.ones(4, dtype=torch.float64))
    chain = Chain([NormBound(0.5), GaussianSum(noise_multiplier=1.3, clip=0.5, expected_clients=4.0)])
    out, _, info = chain.update(zeros, {}, gen)
    noise_on_sum = out.rows[0].double() * 4.0  # the release is (sum + noise) / (q N)
    assert noise_on_sum.std().item() == pytest.approx(1.3 * 0.5, rel=0.01)
    assert abs(noise_on_sum.mean().item()) < 0.01 and info["noise_std"] == pytest.approx(0.65)


def test_local_dp_clips_and_noises_each_clients_delta_from_its_own_stream():
    local = LocalGaussian(noise_multiplier=0.0, clip=1.0, prefix="dy/", streams=Streams(0))
    m = Message(
        {"dy/w": np.array([3.0, 4.0], np.float32), "dc/w": np.array([7.0], np.float32)}, {"num_samples": 3}
    )
    out = local.apply(1, 2, m)
    np.testing.assert_allclose(out.arrays["dy/w"], [0.6, 0.8], rtol=1e-6)
    assert out.arrays["dc/w"] is m.arrays["dc/w"] and out.meta == m.meta
    noisy = LocalGaussian(2.0, 1.0, "", Streams(0))
    big = Message({"w": np.zeros(100000, np.float32)})
    a, b = noisy.apply(1, 2, big).arrays["w"], noisy.apply(1, 3, big).arrays["w"]
    assert a.std() == pytest.approx(2.0, rel=0.02) and not np.array_equal(a, b)


def test_a_private_run_reports_epsilon_each_round(tmp_path):
    config = tiny_config(
        rounds=3,
        algorithm={"name": "fedavg", "fraction": 0.5},
        privacy={"enabled": True, "noise_multiplier": 1.0},
    )
    rows = start(config, tmp_path / "dp", progress=False).read_metrics()
    eps = [r["epsilon"] for r in rows]
    reference = rdp.RdpAccountant()
    reference.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1.0)), 3)
    assert eps[0] == 0.0 and eps[1] < eps[2] < eps[3]
    assert eps[3] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    assert all(math.isfinite(r["loss"]) for r in rows) and rows[1]["noise_std"] == 1.0
    from taciturn.report.html import write_report
    from taciturn.report.rundir import RunDir

    report = write_report(RunDir(tmp_path / "dp")).read_text()
    assert f"epsilon = {eps[3]:.4g} after round 3" in report


def test_bad_privacy_configs_fail_before_work():
    with pytest.raises(ConfigError, match="exactly one"):
        tiny_config(privacy={"enabled": True})
    with pytest.raises(ConfigError, match="leave"):
        tiny_config(privacy={"enabled": True, "noise_multiplier": 1.0}, aggregation={"kind": "median"})
    with pytest.raises(ConfigError, match="fedavg, fedprox or scaffold"):
        tiny_config(algorithm={"name": "fedadmm"}, privacy={"enabled": True, "noise_multiplier": 1.0})


def test_central_dp_releases_its_noise_even_when_no_update_arrives(tmp_path):
    from taciturn.core.params import flatten, sub
    from taciturn.core.rng import SERVER
    from taciturn.experiments.runner import prepare

    config = tiny_config(
        algorithm={"name": "fedavg", "fraction": 0.5},
        channel={"drop_up": 1.0},
        privacy={"enabled": True, "noise_multiplier": 1.3, "clip": 0.5},
    )
    exp = prepare(config, tmp_path)
    state = exp.algorithm.init_server(exp.task.init_params(exp.streams.torch(0, SERVER, "init")), 8)
    new, report = exp.federation.run_round(state, 1)
    assert report.accepted == []
    names = sorted(state.params)
    moved = flatten({n: sub(new.params, state.params)[n] for n in names}).double()
    d = moved.numel()
    noise = torch.randn(d, generator=exp.streams.torch(1, SERVER, "server-chain"), dtype=torch.float64)
    torch.testing.assert_close(moved, (noise * 1.3 * 0.5 / 4.0).float().double(), rtol=1e-5, atol=1e-6)

"""Every array an algorithm sends about its data is covered by the privacy or robustness mechanism
the config asks for, or the combination is refused before work: checked for every algorithm in
the registry (issue 39: SCAFFOLD's control-variate update went out unclipped and un-noised, and
past the median)."""

import pytest
import torch

from taciturn.algorithms import REGISTRY
from taciturn.core.rng import SERVER
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import prepare
from tests.conftest import tiny_config

CENTRAL = {"enabled": True, "mode": "central", "noise_multiplier": 1.0, "clip": 1e-7}
LOCAL = {"enabled": True, "mode": "local", "noise_multiplier": 1.0, "clip": 1e-7}
MEDIAN_UNDER_ATTACK = {
    "aggregation": {"kind": "median"},
    "attack": {"kind": "gaussian", "fraction": 0.25, "strength": 1e30},  # 2 of 8 clients send 1e30
}
MECHANISMS = {
    "central DP": {"privacy": CENTRAL},
    "local DP": {"privacy": LOCAL},
    "median": MEDIAN_UNDER_ATTACK,
}


def state_tensors(state) -> dict[str, torch.Tensor]:
    """Every tensor of a server state (a dataclass of tensor dicts)."""
    return {
        f"{field}/{name}": tensor
        for field, value in vars(state).items()
        if isinstance(value, dict)
        for name, tensor in value.items()
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point()
    }


def largest_move(tmp_path, name: str, rounds: int = 2, **tables) -> float:
    """The largest change of any value of the server state over ``rounds`` rounds."""
    config = tiny_config(algorithm={"name": name, "fraction": 0.75}, **tables)  # 6 clients a round
    exp = prepare(config, tmp_path)
    state = exp.algorithm.init_server(exp.task.init_params(exp.streams.torch(0, SERVER, "init")), 8)
    before = {k: v.clone() for k, v in state_tensors(state).items()}
    for r in range(1, rounds + 1):
        state, _ = exp.federation.run_round(state, r)
    after = state_tensors(state)
    assert set(after) == set(before)
    return max(float((after[k] - before[k]).abs().max()) for k in before)


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("name", REGISTRY)
def test_every_algorithm_is_covered_by_each_mechanism_or_refused_before_work(tmp_path, name, mechanism):
    tables = MECHANISMS[mechanism]
    if not REGISTRY[name].covers_secrets():
        with pytest.raises(ConfigError, match="must cover every array an algorithm sends"):
            tiny_config(algorithm={"name": name}, **tables)
        return
    moved = largest_move(tmp_path / "on", name, **tables)
    if mechanism == "median":  # 2 of 6 send 1e30 in every array: the median keeps the state sane
        assert moved < 10.0
    else:  # clip 1e-7 and noise std 1e-7: nothing the clients send moves the state further
        assert moved < 1e-4
    plain = largest_move(tmp_path / "off", name)  # without the mechanism the state moves for real
    assert plain > 1e-3


def test_scaffolds_control_is_noised_under_central_dp(tmp_path):
    """Issue 39: the server's new control was identical for z = 1, S = 0.5 and z = 1e6, S = 1e-6."""

    def control(**privacy):
        config = tiny_config(
            algorithm={"name": "scaffold", "fraction": 0.75},
            privacy={"enabled": True, "reproducible_noise": True} | privacy,
        )
        exp = prepare(config, tmp_path / str(privacy["clip"]))
        state = exp.algorithm.init_server(exp.task.init_params(exp.streams.torch(0, SERVER, "init")), 8)
        state, _ = exp.federation.run_round(state, 1)
        return torch.cat([v.reshape(-1) for v in state.control.values()])

    a, b = control(noise_multiplier=1.0, clip=0.5), control(noise_multiplier=1e6, clip=1e-6)
    assert not torch.allclose(a, b)
    # with S = 1e-6 and z S = 1: c moves by q x (sum of clipped dc + noise of std 1) / (q N) ~ 1 / N
    assert b.std().item() == pytest.approx(1.0 / 8, rel=0.5)


def test_secure_aggregation_refuses_algorithms_it_cannot_weigh():
    with pytest.raises(ConfigError, match="stateless clients"):
        tiny_config(algorithm={"name": "scaffold"}, secagg={"enabled": True})

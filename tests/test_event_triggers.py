"""The two uplink triggers beyond the paper (event_admm.py ``trigger_units``): exact units, and on a
least-squares case with a known optimum the ``progress`` trigger keeps ADMM's fixed point and
reaches a given accuracy with fewer events than any constant Delta that reaches it."""

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import ClientContext
from taciturn.algorithms.event_admm import EventADMM, EventADMMConfig
from taciturn.core import Direction, Message, Streams
from taciturn.data.datasets import ArrayDataset
from taciturn.data.federated import FederatedData
from tests.quadratic import ExactXUpdate, federation, least_squares_data, optimum, run, start


class ExactEventADMM(ExactXUpdate, EventADMM):
    pass


def vec(*values):
    return {"w": torch.tensor(values, dtype=torch.float64)}


def ctx_for(state, received, round=3):
    data = least_squares_data()  # N = 5 agents
    return ClientContext(0, round, received, state, 20, Streams(0), data, lambda p, b: 0)


def test_relative_threshold_is_delta_times_the_norm_of_the_last_sent_vector():
    held = {"z_hat/w": vec(0.0, 0.0)["w"], "last/w": vec(6.0, 8.0)["w"], "u/w": vec(0.0, 0.0)["w"]}
    # v = x + u = (6, 8) + (3, 4): ||v - last|| = 5, ||last|| = 10, so the threshold 0.5 * 10 = 5 fires
    for delta, fires in ((0.5, True), (0.5 + 1e-12, False)):
        algorithm = EventADMM(EventADMMConfig(delta=delta, trigger="relative"))
        out = algorithm.finish(ctx_for(held, None), vec(0.0, 0.0), vec(0.0, 0.0), vec(9.0, 12.0), {})
        assert (out.uplink is not None) == fires
        assert out.info["trigger_norm"] == 5.0 and out.info["trigger_unit/relative"] == 10.0


def test_progress_threshold_is_delta_n_times_the_last_z_step_and_fades_in_silence():
    held = {"z_hat/w": vec(0.0, 0.0)["w"], "last/w": vec(0.0, 0.0)["w"]}
    algorithm = EventADMM(EventADMMConfig(delta=0.1, trigger="progress", progress_fade=0.5))
    # a new z = (0.3, 0.4) arrived: step 0.5, unit N * 0.5 = 2.5, threshold 0.25; v = (0.15, 0.2) + z
    z = vec(0.3, 0.4)
    out = algorithm.finish(
        ctx_for(held, Message({"w": np.array([0.3, 0.4])})), z, vec(0.0, 0.0), vec(0.45, 0.6), {}
    )
    assert out.info["trigger_unit/progress"] == pytest.approx(2.5)
    assert out.uplink is not None  # ||v - last|| = 0.75 >= 0.25
    assert out.state["z_step"].item() == pytest.approx(0.5)
    # next round nothing new arrives: the remembered step fades to 0.25, unit 1.25, threshold 0.125
    quiet = algorithm.finish(ctx_for(out.state, None), z, vec(0.0, 0.0), vec(0.39, 0.52), {})
    assert quiet.info["trigger_unit/progress"] == pytest.approx(1.25)
    assert quiet.info["trigger_norm"] == pytest.approx(0.1)  # ||(0.39, 0.52) - (0.45, 0.6)||
    assert quiet.uplink is None and quiet.state["z_step"].item() == pytest.approx(0.25)


def flat_agents_data(loud=2, quiet=3, n=30, dim=3, scale=0.05, seed=0) -> FederatedData:
    """``loud`` agents with unit-scale least squares and ``quiet`` agents whose rows and noise are
    scaled by ``scale`` (nearly flat losses): agents whose updates differ in size by orders of
    magnitude, which one constant Delta cannot serve."""
    rng = np.random.default_rng(seed)
    xs, ys, parts = [], [], []
    for i in range(loud + quiet):
        s = 1.0 if i < loud else scale
        a = rng.normal(size=(n, dim)) * s
        xs.append(a)
        ys.append(3 * a @ rng.normal(size=dim) + s * rng.normal(size=n))
        parts.append(np.arange(i * n, (i + 1) * n))
    x, y = torch.tensor(np.concatenate(xs)), torch.tensor(np.concatenate(ys))
    return FederatedData.from_parts(ArrayDataset("quiet", x, y, x[:1], y[:1], 1, "test"), parts)


def error_and_events(data, rounds, **config):
    algorithm = ExactEventADMM(EventADMMConfig(rho=1.0, delta_z=0.0, **config))
    fed = federation(algorithm, data)
    state = run(fed, start(algorithm, data), rounds)
    events = fed.executor.pipeline.channel.ledger.totals(Direction.UP).messages_sent
    return float(torch.linalg.norm(state.z["w"] - optimum(data))), events


def test_progress_trigger_reaches_the_optimum_with_fewer_events_than_any_constant_delta():
    data = flat_agents_data()
    target, rounds = 1e-4, 60
    error, events = error_and_events(data, rounds, trigger="progress", delta=0.3)
    assert error < target  # the fixed point is ADMM's: the error keeps falling toward zero
    assert events < 0.4 * 5 * rounds  # Delta = 0 sends 5 vectors a round
    # a constant Delta either stops short of the target (an O(Delta) floor) or talks more
    for delta in (3e-5, 1e-4, 1e-3):
        constant_error, constant_events = error_and_events(data, rounds, delta=delta)
        assert constant_error >= target or constant_events > events, delta

"""Server-side checks against the attacks of issue 18, part 1: wrong dtypes, lying weights,
finite updates whose sum overflows. No crash, and never a non-finite model."""

import logging
import re

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import Arrival
from taciturn.algorithms.fedavg import FedAvg
from taciturn.algorithms.scaffold import Scaffold, ScaffoldConfig
from taciturn.core import Message
from taciturn.core.rng import SERVER
from taciturn.engine.trust import TrustConfig, TrustedWeights
from taciturn.engine.validation import state_problem
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import prepare
from tests.conftest import tiny_config


class Hostile(FedAvg):
    """FedAvg whose client 0 (and 1, if ``both``) rewrites its uplink with ``forge``."""

    def __init__(self, config, forge, both=False):
        super().__init__(config)
        self.forge, self.both = forge, both
        self.seen: dict[int, int] = {}

    def client_end(self, ctx, work, result):
        out = super().client_end(ctx, work, result)
        if ctx.client == 0 or (self.both and ctx.client == 1):
            arrays, meta = self.forge(dict(out.uplink.arrays), dict(out.uplink.meta))
            out.uplink = Message(arrays, meta)
        return out

    def accumulate(self, arrivals):
        self.seen |= {a.client: a.message.meta["num_samples"] for a in arrivals}
        return super().accumulate(arrivals)


def hostile_round(tmp_path, forge, both=False, **overrides):
    exp = prepare(tiny_config(algorithm={"name": "fedavg", "fraction": 1.0}, **overrides), tmp_path)
    params = exp.task.init_params(exp.streams.torch(0, SERVER, "init"))
    state = exp.algorithm.init_server(params, exp.data.num_clients)
    hostile = Hostile(exp.algorithm.config, forge, both)
    exp.federation.algorithm = exp.federation.executor.pipeline.algorithm = hostile
    new_state, report = exp.federation.run_round(state, 1)
    return exp, hostile, state, new_state, report


def cast(dtype):
    return lambda arrays, meta: ({k: v.astype(dtype) for k, v in arrays.items()}, meta)


@pytest.mark.parametrize(
    ("dtype", "name"), [(np.float64, "float64"), (np.int64, "int64"), (np.bool_, "bool")]
)
def test_an_uplink_of_another_dtype_is_rejected_and_the_next_round_runs(tmp_path, dtype, name):
    exp, _, _, state, report = hostile_round(tmp_path, cast(dtype))
    ((client, reason),) = report.rejected
    assert client == 0 and f"dtype {name}, expected float32" in reason
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in state.params.values())
    state, report = exp.federation.run_round(state, 2)  # the global model still has its dtype
    assert len(report.accepted) == 7


def test_a_claimed_sample_count_is_replaced_by_the_known_size(tmp_path):
    def lie(arrays, meta):
        return {
            k: np.random.default_rng(0).normal(size=v.shape).astype(np.float32) for k, v in arrays.items()
        }, {
            **meta,
            "num_samples": 10**12,
        }

    exp, hostile, _, _, report = hostile_round(tmp_path, lie)
    assert report.accepted == list(range(8))
    assert hostile.seen == {c: exp.data.client_size(c) for c in range(8)}


def test_trusted_weights_known_capped_equal(tmp_path):
    exp = prepare(tiny_config(), tmp_path)
    sizes = [exp.data.client_size(c) for c in range(8)]
    known = TrustedWeights(TrustConfig(), exp.data)
    capped = TrustedWeights(TrustConfig(weights="capped", max_samples=40), exp.data)
    equal = TrustedWeights(TrustConfig(weights="equal"), exp.data)
    assert [known.weight(c, 10**12) for c in range(8)] == sizes
    assert capped.weight(3, 10**12) == 40 and capped.weight(3, 7) == 7
    assert equal.weight(5, 10**12) == 1
    assert (known.total(), capped.total(), equal.total()) == (400, sum(min(s, 40) for s in sizes), 8)
    message = Message({"w": np.zeros(2, np.float32)}, {"num_samples": 10**12, "train_loss": 0.5})
    trusted = capped.apply(2, message)
    assert (
        trusted.meta == {"num_samples": 40, "train_loss": 0.5} and trusted.arrays["w"] is message.arrays["w"]
    )
    with pytest.raises(ConfigError, match="max_samples"):
        tiny_config(server={"weights": "capped"})


def test_finite_updates_whose_sum_overflows_skip_the_round_and_keep_the_model(tmp_path, caplog):
    def huge(arrays, meta):
        return {k: np.full_like(v, 3e38) for k, v in arrays.items()}, meta

    with caplog.at_level(logging.WARNING):
        _, _, before, after, report = hostile_round(tmp_path, huge, both=True, server={"weights": "equal"})
    assert report.rejected == [] and len(report.accepted) == 8  # each update is finite on its own
    assert "non-finite" in report.skipped
    assert after is before  # the model kept as it was
    assert any("round 1 skipped" in r.message for r in caplog.records)


def test_a_scaled_finite_update_never_makes_the_model_non_finite(tmp_path):
    def scale(arrays, meta):
        return {k: v * np.float32(1e6) for k, v in arrays.items()}, meta

    _, _, _, state, report = hostile_round(tmp_path, scale)
    assert report.skipped is None
    assert state_problem(state) is None


def test_state_problem_names_the_non_finite_tensor():
    from taciturn.algorithms.scaffold import ScaffoldState

    state = ScaffoldState({"w": torch.ones(2)}, {"w": torch.tensor([0.0, float("nan")])})
    assert state_problem(state) == "the aggregate made control.w non-finite (1 NaN/Inf values)"
    assert state_problem(ScaffoldState({"w": torch.ones(2)}, {"w": torch.zeros(2)})) is None


def test_scaffold_weights_come_from_the_server_not_the_client():
    algorithm = Scaffold(ScaffoldConfig())
    algorithm.use_population(num_clients=4, total_weight=100)
    state = algorithm.init_server({"w": torch.zeros(1)}, 4)

    def uplink(dy, dc, n):
        return Message(
            {"dy/w": np.array([dy], np.float32), "dc/w": np.array([dc], np.float32)}, {"num_samples": n}
        )

    new = algorithm.aggregate(
        state, 1, algorithm.accumulate([Arrival(0, uplink(1.0, 2.0, 10)), Arrival(1, uplink(3.0, 4.0, 30))])
    )
    # x: (10*1 + 30*3) / 40 = 2.5; c: 0.1*2 + 0.3*4 = 1.4 (p_i = n_i / 100)
    torch.testing.assert_close(new.params["w"], torch.tensor([2.5]))
    torch.testing.assert_close(new.control["w"], torch.tensor([1.4]))
    uniform = Scaffold(ScaffoldConfig(weighting="uniform"))
    uniform.use_population(num_clients=4, total_weight=100)
    new = uniform.aggregate(
        state, 1, uniform.accumulate([Arrival(0, uplink(1.0, 2.0, 10)), Arrival(1, uplink(3.0, 4.0, 30))])
    )
    torch.testing.assert_close(new.params["w"], torch.tensor([2.0]))
    torch.testing.assert_close(new.control["w"], torch.tensor([1.5]))


def test_uplink_problem_names_exactly_what_is_wrong():
    from taciturn.algorithms.base import ArraySpec
    from taciturn.engine.validation import uplink_problem

    spec = {"a": ArraySpec((2, None), np.dtype(np.float32)), "b": ArraySpec((3,), np.dtype(np.int32))}
    good = {"a": np.zeros((2, 5), np.float32), "b": np.zeros(3, np.int32)}
    assert uplink_problem(Message(good), spec) is None
    assert uplink_problem(Message({"a": good["a"], "c": good["b"]}), spec) == (
        "missing arrays ['b']; unexpected arrays ['c']"
    )
    assert uplink_problem(Message({"a": good["a"]}), spec) == "missing arrays ['b']"
    assert uplink_problem(Message(good | {"c": good["b"]}), spec) == "unexpected arrays ['c']"
    for shape in ((3, 5), (2,), (2, 5, 1)):
        assert uplink_problem(Message(good | {"a": np.zeros(shape, np.float32)}), spec) == (
            f"array 'a' has shape {shape}, expected (2, None)"
        )
    assert uplink_problem(Message(good | {"b": np.zeros(4, np.int32)}), spec) == (
        "array 'b' has shape (4,), expected (3,)"
    )
    assert uplink_problem(Message(good | {"b": np.zeros(3, np.int64)}), spec) == (
        "array 'b' has dtype int64, expected int32"
    )
    bad = np.array([[np.nan, 1.0, np.inf, -np.inf, 0.0]] * 2, np.float32)
    bad[1] = 0.0
    assert uplink_problem(Message(good | {"a": bad}), spec) == "array 'a' has 3 non-finite values (NaN/Inf)"


def test_state_problem_walks_nested_dataclasses_and_mappings_and_ignores_integers():
    import dataclasses

    @dataclasses.dataclass
    class Inner:
        w: torch.Tensor
        counts: torch.Tensor

    @dataclasses.dataclass
    class Outer:
        inner: Inner
        duals: dict

    finite = Outer(Inner(torch.ones(3), torch.zeros(2, dtype=torch.int64)), {"x": torch.zeros(2)})
    assert state_problem(finite) is None
    assert state_problem(Outer) is None  # a class, not a state
    broken = Outer(Inner(torch.tensor([float("nan"), 1.0, float("inf")]), torch.zeros(2)), {})
    assert state_problem(broken) == "the aggregate made inner.w non-finite (2 NaN/Inf values)"
    in_mapping = Outer(Inner(torch.ones(3), torch.zeros(2)), {"x": torch.tensor([0.0, -float("inf")])})
    assert state_problem(in_mapping) == "the aggregate made duals.x non-finite (1 NaN/Inf values)"
    assert (
        state_problem({"w": torch.tensor([float("nan")])})
        == "the aggregate made w non-finite (1 NaN/Inf values)"
    )


@pytest.mark.parametrize("feedback", ["ef21", None])
def test_a_non_finite_update_under_compression_is_never_averaged_in_and_the_run_goes_on(tmp_path, feedback):
    """int8 cannot encode a NaN's block scale. Without feedback the server rejects what arrives;
    with EF21 the client rebuilds what the server would receive, and that fails on the client:
    before, the CompressionError ended the whole run (it stopped benchmarks/frontier.py). Now that
    client fails alone, as its ClientApp would in a deployment; its memory is not kept."""

    def poison(arrays, meta):
        return {k: np.full_like(v, np.nan) for k, v in arrays.items()}, meta

    compression = {"up": ["int8"]} | ({"up_feedback": feedback} if feedback else {})
    exp, _, _, state, report = hostile_round(tmp_path, poison, compression=compression)
    why = r"CompressionError: array '.+': block scales must be finite and non-negative"
    if feedback:
        assert report.rejected == [] and [c for c, _ in report.failed] == [0]
        assert re.fullmatch(why, report.failed[0][1])
    else:
        assert report.failed == [] and [c for c, _ in report.rejected] == [0]
        assert re.fullmatch(why.removeprefix("CompressionError: "), report.rejected[0][1])
    assert report.accepted == list(range(1, 8))
    assert all(torch.isfinite(v).all() for v in state.params.values())
    store = exp.federation.executor.pipeline.store
    assert store.get(0) is None  # nothing of client 0's round kept
    assert (store.get(1) is not None) == bool(feedback)  # an accepted client's reference copy is

"""Server-side rules against hand-computed cases, and the chain inside a run."""

import math

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import Arrival
from taciturn.algorithms.fedavg import FedAvg, FedAvgConfig, FedAvgState
from taciturn.algorithms.scaffold import Scaffold, ScaffoldConfig
from taciturn.core import Message
from taciturn.core.rng import Streams
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import resume, start
from taciturn.report.rundir import RunDir
from taciturn.server.aggregation import ServerAggregation, build_chain
from taciturn.server.centered_clip import CenteredClip
from taciturn.server.clipping import AdaptiveClip, NormBound
from taciturn.server.config import AggregationConfig
from taciturn.server.coordinatewise import Mean, Median, TrimmedMean
from taciturn.server.krum import Krum
from taciturn.server.transform import Chain, OutsideGuarantee, Updates
from tests.conftest import tiny_config

GEN = torch.Generator().manual_seed(0)


def ups(rows, weights=None):
    rows = torch.tensor(rows, dtype=torch.float32)
    w = (
        torch.ones(len(rows), dtype=torch.float64)
        if weights is None
        else torch.tensor(weights, dtype=torch.float64)
    )
    return Updates(rows, w)


def run(piece, updates, state=None):
    out, state, info = piece.update(
        updates, piece.init(updates.rows.shape[1]) if state is None else state, GEN
    )
    return out, state, info


def test_mean_median_and_trimmed_mean_by_hand():
    u = ups([[1.0, 10.0], [2.0, 20.0], [100.0, -5.0]], [1, 1, 2])
    out, _, _ = run(Mean(), u)
    torch.testing.assert_close(out.rows[0], torch.tensor([(1 + 2 + 200) / 4, (10 + 20 - 10) / 4]))
    assert out.weights.tolist() == [4.0]
    torch.testing.assert_close(run(Median(), u)[0].rows[0], torch.tensor([2.0, 10.0]))
    even = ups([[1.0], [2.0], [4.0], [100.0]])
    torch.testing.assert_close(run(Median(), even)[0].rows[0], torch.tensor([3.0]))  # mean of the middle two
    five = ups([[5.0], [-50.0], [1.0], [2.0], [90.0]])
    # beta = 0.2 of 5: one value cut at each end -> mean(1, 2, 5)
    torch.testing.assert_close(run(TrimmedMean(0.2), five)[0].rows[0], torch.tensor([8.0 / 3]))
    torch.testing.assert_close(run(TrimmedMean(0.0), five)[0].rows[0], torch.tensor([48.0 / 5]))


def test_the_trimmed_mean_trims_at_least_one_at_each_end_when_asked_to_trim():
    """Issue 39: trim 0.2 of 4 arrivals removed floor(0.8) = 0, and one x1000 outlier gave 250."""
    four = ups([[1.0], [1.0], [1.0], [1000.0]])
    torch.testing.assert_close(run(TrimmedMean(0.2), four)[0].rows[0], torch.tensor([1.0]))
    assert run(TrimmedMean(0.2), four)[2] == {"trimmed": 2.0}
    with pytest.raises(OutsideGuarantee, match="needs at least 3 updates, 2 arrived"):
        run(TrimmedMean(0.1), ups([[1.0], [1000.0]]))


def test_krum_and_multi_krum_scores_by_hand():
    u = ups([[0.0], [1.0], [3.0], [10.0]])
    # f = 0: n - f - 2 = 2 neighbours; squared distances give scores 0:1+9, 1:1+4, 3:4+9, 10:49+81
    torch.testing.assert_close(run(Krum(0), u)[0].rows[0], torch.tensor([1.0]))
    torch.testing.assert_close(run(Krum(0, select=2), u)[0].rows[0], torch.tensor([0.5]))
    # f = 1 needs n > 4: with 11 added, 2 neighbours; scores 0:1+9, 1:1+4, 3:4+9, 10:1+49, 11:1+64;
    # Multi-Krum's m = n - f = 4 -> mean(0, 1, 3, 10); a larger select is cut to n - f
    five = ups([[0.0], [1.0], [3.0], [10.0], [11.0]])
    torch.testing.assert_close(run(Krum(1, select=None), five)[0].rows[0], torch.tensor([3.5]))
    torch.testing.assert_close(run(Krum(1, select=5), five)[0].rows[0], torch.tensor([3.5]))


def test_krum_refuses_rounds_too_small_for_its_f():
    """Issue 39: with n = 5 and f = 2 (n <= 2f + 2) two identical colluders scored 0 and won."""
    colluded = ups([[0.0], [1.0], [2.0], [100.0], [100.0]])
    with pytest.raises(OutsideGuarantee, match="n > 2f \\+ 2 = 6 updates; 5 arrived"):
        run(Krum(2), colluded)
    torch.testing.assert_close(run(Krum(1), colluded)[0].rows[0], torch.tensor([1.0]))  # n > 4: honest


def test_centered_clip_by_hand_and_its_center_carries_over():
    piece = CenteredClip(tau=1.0)
    out, state, _ = run(piece, ups([[3.0, 4.0], [0.0, 0.5]]))
    # (3, 4) clipped to norm 1 around 0 -> (0.6, 0.8); (0, 0.5) is within: mean (0.3, 0.65)
    torch.testing.assert_close(out.rows[0], torch.tensor([0.3, 0.65]))
    out, _, _ = run(piece, ups([[0.3, 0.65 + 5.0]]), state)
    torch.testing.assert_close(out.rows[0], torch.tensor([0.3, 1.65]))  # one step of tau from the center
    two = CenteredClip(tau=1.0, iterations=2)
    out, _, _ = run(two, ups([[3.0, 4.0]]))
    torch.testing.assert_close(out.rows[0], torch.tensor([1.2, 1.6]))


def test_norm_bound_clips_exactly_to_the_bound_and_leaves_short_updates_alone():
    rows = (
        torch.randn(20, 50, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.01, 3, 20)[:, None]
    )
    out, _, info = run(NormBound(1.5), Updates(rows, torch.ones(20, dtype=torch.float64)))
    norms = out.rows.norm(dim=1)
    assert (norms <= 1.5 * (1 + 1e-6)).all()
    short = rows.norm(dim=1) <= 1.5
    assert torch.equal(out.rows[short], rows[short])
    torch.testing.assert_close(norms[~short], torch.full((int((~short).sum()),), 1.5))
    assert info["clipped"] == float((~short).sum())


def test_adaptive_clip_follows_andrew_et_al_geometric_update():
    u = ups([[0.5], [2.0], [3.0], [0.1]])  # norms: two of four within C = 1
    _, state, info = run(AdaptiveClip(1.0, 0.5, 0.2), u)
    assert float(state["clip"]) == pytest.approx(1.0)  # b = gamma: no change
    _, state, info = run(AdaptiveClip(1.0, 0.25, 0.2), u)
    assert float(state["clip"]) == pytest.approx(math.exp(-0.2 * (0.5 - 0.25)))
    assert info == {"clip_norm": 1.0, "clipped": 2.0}


def test_chain_keeps_each_piece_state_apart():
    chain = Chain([AdaptiveClip(2.0, 0.5, 0.1), CenteredClip(10.0)])
    state = chain.init(2)
    assert set(state) == {"0/clip", "1/center"}
    out, state, _ = chain.update(ups([[3.0, 4.0], [0.0, 1.0]]), state, GEN)
    # clip to 2: (1.2, 1.6) and (0, 1); centered clip with tau 10 around 0 is the mean
    torch.testing.assert_close(out.rows[0], torch.tensor([0.6, 1.3]))
    torch.testing.assert_close(state["1/center"], torch.tensor([0.6, 1.3]))
    assert float(state["0/clip"]) == pytest.approx(2.0)


def message(w, n, dc=None):
    arrays = (
        {"w": np.array(w, np.float32)}
        if dc is None
        else {
            "dy/w": np.array(w, np.float32),
            "dc/w": np.array(dc, np.float32),
        }
    )
    return Message(arrays, {"num_samples": n})


def test_fedavg_with_the_median_moves_the_model_by_the_median_delta():
    algorithm = FedAvg(FedAvgConfig())
    chain = ServerAggregation(build_chain(AggregationConfig(kind="median")), algorithm, Streams(0))
    arrivals = [
        Arrival(c, message(w, n))
        for c, (w, n) in enumerate([([1.0, 0.0], 5), ([2.0, 1.0], 1), ([1e6, -1e6], 9)])
    ]
    state = FedAvgState({"w": torch.zeros(2)})
    standing, _, _ = chain.apply(1, arrivals, algorithm.uplink_spec(state))
    state = algorithm.aggregate(state, 1, algorithm.accumulate(standing))
    torch.testing.assert_close(state.params["w"], torch.tensor([2.0, 0.0]))


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_scaffold_chain_applies_the_rule_to_dy_and_dc(weighting):
    """Issue 39: the chain covered only dy, so under the median 2 of 6 clients sending 1e30 in dc
    still reached the server's control c. Now the median is taken over (dy, dc), and c moves by
    (sum_S p_i) x the median dc."""
    algorithm = Scaffold(ScaffoldConfig(weighting=weighting))
    algorithm.use_population(num_clients=10, total_weight=100)
    chain = ServerAggregation(build_chain(AggregationConfig(kind="median")), algorithm, Streams(0))
    honest = [([1.0], 10, [1.0]), ([2.0], 30, [2.0]), ([9.0], 20, [4.0]), ([3.0], 10, [3.0])]
    attackers = [([1e30], 20, [1e30]), ([-1e30], 10, [1e30])]
    arrivals = [Arrival(c, message(w, n, dc=dc)) for c, (w, n, dc) in enumerate(honest + attackers)]
    state = algorithm.init_server({"w": torch.zeros(1)}, 10)
    standing, _, _ = chain.apply(1, arrivals, algorithm.uplink_spec(state))
    state = algorithm.aggregate(state, 1, algorithm.accumulate(standing))
    torch.testing.assert_close(state.params["w"], torch.tensor([2.5]))  # median of dy
    share = 1.0 if weighting == "samples" else 6 / 10  # sum_S p_i: all the weight, or 6 of 10 clients
    torch.testing.assert_close(state.control["w"], torch.tensor([share * 3.5]))  # median of dc: 3.5


def test_scaffold_chain_with_the_mean_keeps_line_17_exactly():
    """The plain mean through the chain is SCAFFOLD's own update: c + sum_{i in S} p_i dc_i."""
    algorithm = Scaffold(ScaffoldConfig(weighting="uniform"))
    algorithm.use_population(num_clients=10, total_weight=100)
    chain = ServerAggregation(build_chain(AggregationConfig(clip_norm=100.0)), algorithm, Streams(0))
    arrivals = [Arrival(c, message([c], 1, dc=[2.0 * c])) for c in range(4)]
    state = algorithm.init_server({"w": torch.zeros(1)}, 10)
    standing, _, _ = chain.apply(1, arrivals, algorithm.uplink_spec(state))
    state = algorithm.aggregate(state, 1, algorithm.accumulate(standing))
    torch.testing.assert_close(state.params["w"], torch.tensor([1.5]))
    torch.testing.assert_close(state.control["w"], torch.tensor([(0 + 2 + 4 + 6) / 10]))


def test_rules_that_need_a_delta_are_refused_for_other_algorithms():
    with pytest.raises(ConfigError, match="fedavg, fedprox or scaffold"):
        tiny_config(algorithm={"name": "fedadmm"}, aggregation={"kind": "median"})
    with pytest.raises(ConfigError, match="clip_norm"):
        tiny_config(aggregation={"adaptive": True})


def metrics(rundir: RunDir):
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rundir.read_metrics()]


def test_a_stateful_chain_resumes_with_the_numbers_of_an_uninterrupted_run(tmp_path):
    config = tiny_config(
        rounds=5, aggregation={"kind": "centered_clip", "tau": 0.5, "clip_norm": 1.0, "adaptive": True}
    )
    whole = start(config, tmp_path / "whole", progress=False)
    rows = metrics(whole)
    assert rows[-1]["clip_norm"] != rows[1]["clip_norm"]  # the adaptive bound moved and is reported

    class Stop(Exception):
        pass

    def stop(end):
        if end.round == 3:
            raise Stop

    with pytest.raises(Stop):
        start(config, tmp_path / "cut", progress=False, callbacks=(stop,))
    assert metrics(resume(tmp_path / "cut", progress=False)) == rows


def test_parallel_workers_send_per_client_updates_and_agree_with_sequential(tmp_path):
    config = dict(
        rounds=2, algorithm={"name": "fedavg", "fraction": 0.75}, aggregation={"kind": "krum", "byzantine": 1}
    )
    seq = start(tiny_config(**config), tmp_path / "seq", progress=False)
    par = start(
        tiny_config(engine={"executor": "parallel", "workers": 2}, **config), tmp_path / "par", progress=False
    )
    a, b = metrics(seq), metrics(par)
    assert [r["accuracy"] for r in a] == [r["accuracy"] for r in b]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-6)


@pytest.mark.parametrize(
    ("aggregation", "says"),
    [
        ({"kind": "krum", "byzantine": 1}, "more than 2f \\+ 2 = 4 updates a round"),
        ({"kind": "multi_krum", "byzantine": 5}, "more than 2f \\+ 2 = 12 updates"),
        ({"kind": "multi_krum", "byzantine": 0, "select": 4}, "select = 4 averages more than"),
    ],
)
def test_rules_outside_their_guarantee_for_the_rounds_size_are_refused_before_work(
    tmp_path, aggregation, says
):
    """Issue 39: Krum with n <= 2f + 2, and byzantine of 5 with 4 clients a round, were accepted."""
    config = tiny_config(algorithm={"name": "fedavg", "fraction": 0.5}, aggregation=aggregation)  # 4 a round
    if aggregation.get("select"):
        config = tiny_config(algorithm={"name": "fedavg", "fraction": 0.375}, aggregation=aggregation)  # 3
    with pytest.raises(ConfigError, match=says):
        start(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    trimmed = tiny_config(
        algorithm={"name": "fedavg", "fraction": 0.25}, aggregation={"kind": "trimmed_mean"}
    )
    with pytest.raises(ConfigError, match="3 or more updates a round, and a round has 2"):
        start(trimmed, tmp_path / "trimmed", progress=False)


def test_a_round_that_shrank_below_the_rules_guarantee_is_skipped_with_the_reason(tmp_path):
    """Krum with f = 1 and 6 clients a round: rounds where drops leave 4 or fewer arrivals are
    skipped (model kept, reason in events.jsonl), the others aggregate."""
    config = tiny_config(
        rounds=6,
        algorithm={"name": "fedavg", "fraction": 0.75},
        channel={"drop_up": 0.4},
        aggregation={"kind": "krum", "byzantine": 1},
    )
    rundir = start(config, tmp_path / "run", progress=False)
    events = RunDir.read_jsonl(rundir.events)
    skipped = [e for e in events if e["event"] == "skipped"]
    assert skipped and all("Krum tolerates f = 1" in e["reason"] for e in skipped)
    assert 0 < rundir.read_metrics()[-1]["skipped"] < 6
    assert "Krum tolerates" in rundir.log.read_text()

"""The FedQ benchmark's pipeline at micro scale (the numbers live in docs/benchmarks.md)."""

import io
import json

import numpy as np
import pytest
from rich.console import Console

from taciturn.core import Channel, Ledger, Streams
from taciturn.core.ledger import Direction
from taciturn.rl import FedQ, FedQFederation
from tests.benchmark_module import load_benchmark


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """Both parts of the benchmark at micro scale, run once: (module, results, plot folder)."""
    bench = load_benchmark("fedq")
    scale = bench.Scale(
        paths=1,
        iclr_episodes=40,
        icml_episodes={"H=2,S=2,A=2": 150, "H=5,S=3,A=2": 60},
        icml_agents=(1, 2),
        sweep_episodes=250,
        sweep_values=(2, 4),
        instances=2,
        instance_paths=1,
        windows=((20, 100),),
    )
    out = tmp_path_factory.mktemp("fedq")
    return bench, bench.run(scale, out, Console(file=io.StringIO())), out


def test_the_benchmark_produces_the_issue_schema_plots_and_docs_at_micro_scale(micro):
    bench, results, out = micro
    assert {k: set(v) for k, v in results["round_slopes"].items()} == {q: {"2", "4"} for q in "MSA"}
    assert {k: set(v) for k, v in results["regret"].items()} == {s: {"1", "2"} for s in bench.SETTINGS}
    assert all(r > 0 for by_m in results["regret"].values() for r in by_m.values())
    names = set(results["iclr"]["normalised_regret"])
    assert names == {"FedQ-H (M=10)", "FedQ-B (M=10)", "UCB-H (M=1)", "UCB-B (M=1)"}
    for png in ("fedq_iclr.png", "fedq_icml_regret.png", "fedq_icml_rounds.png", "fedq_instances.png"):
        assert (out / png).stat().st_size > 1000
    text = bench.markdown(results)
    assert text.startswith("FedQ-Hoeffding") and bench.COMMAND in text and "| FedQ-H (M=10) |" in text
    assert "Sensitivity: mean slope" in text and f"{bench.COMMAND} --instances-only" in text
    without = {k: v for k, v in results.items() if k != "instances"}
    assert "Not yet run at full scale" in bench.markdown(without)


def test_instance_zero_with_one_path_reproduces_the_single_mdp_part_and_other_instances_differ(micro):
    """Instance 0, path seed 0, is the single-MDP part's MDP and first path: the same numbers."""
    _, results, _ = micro
    head, rounds = results["instances"]["headline"], results["instances"]["rounds"]
    for name, quantiles in results["iclr"]["normalised_regret"].items():
        assert head["per_instance"][name]["normalised_regret"][0] == pytest.approx(
            quantiles["median"], rel=1e-12
        )
    for name in ("FedQ-H (M=10)", "FedQ-B (M=10)"):
        assert head["per_instance"][name]["rounds"][0] == results["iclr"]["facts"][name]["rounds"]
    assert rounds["windows"] == ["12.5-250", "20-100"] and rounds["paper_window"] == "12.5-250"
    configs = {(r["S"], r["A"], r["M"], r["instance"]) for r in rounds["runs"]}
    assert configs == {
        (S, A, M, i) for S, A, M in ((2, 2, 2), (2, 2, 4), (4, 2, 2), (2, 4, 2)) for i in (0, 1)
    }
    base = {r["instance"]: r for r in rounds["runs"] if (r["S"], r["A"], r["M"]) == (2, 2, 2)}
    assert base[0]["slopes"]["12.5-250"] == pytest.approx(
        results["icml_rounds"]["slopes"]["M"]["2"], rel=1e-12
    )
    assert base[0]["delta_min"] == results["icml_rounds"]["delta_min"]["M"]["2"]
    assert base[1]["delta_min"] != base[0]["delta_min"]
    assert head["delta_min"][0] == results["iclr"]["mdp"]["delta_min"] != head["delta_min"][1]


def test_a_paths_regret_and_rounds_at_given_episode_counts():
    """Rounds end after 2, 5 and 9 episodes with cumulative regret 1, 4, 6: regret grows linearly
    inside a round (one policy), and a count is reached in the round that plays that episode."""
    bench = load_benchmark("fedq")
    path = bench.FedQPath(
        episodes=np.array([2, 5, 9]),
        regret=np.array([1.0, 4.0, 6.0]),
        rounds=np.array([1, 2, 3]),
        bytes_up=0,
        bytes_down=0,
        scalars_up=0,
        policy_changes=np.zeros(3),
    )
    assert path.regret_at(np.array([0, 1, 2, 3.5, 7, 9])).tolist() == [0.0, 0.5, 1.0, 2.5, 5.0, 6.0]
    assert path.rounds_at(np.array([1, 2, 3, 5, 6, 9])).tolist() == [1, 1, 2, 2, 3, 3]


def test_a_regret_row_reports_medians_over_paths_and_the_last_decades_slope():
    bench = load_benchmark("fedq")
    grid = np.array([1, 10, 100])
    regret = np.array([[0.0, 1.0, 3.0], [0.0, 2.0, 2.0], [0.0, 0.0, 4.0]])  # three paths
    row = bench.Bench._regret_row(grid, regret, 2, grid >= 10)
    ln10 = np.log(10)
    # slopes over (10, 100): 2 / ln 10, 0, 4 / ln 10 -> median 2 / ln 10; final regrets 3, 2, 4
    assert row["slope_per_ln_T"] == pytest.approx(2 / ln10, rel=1e-12)
    assert row["final_regret"] == 3.0 and row["per_agent"] == 1.5  # M = 2 agents
    assert row["final_regret_p10"] == pytest.approx(2.2) and row["final_regret_p90"] == pytest.approx(3.8)
    assert row["median_curve"] == [0.0, 1.0, 3.0]


def test_run_fedq_totals_are_the_rounds_records_and_the_ledgers_bytes():
    """One path through the federation, against the same rounds replayed by hand."""
    bench = load_benchmark("fedq")
    mdp = bench.make_mdp(2, 2, 2)
    path = bench.run_fedq(mdp, 2, "hoeffding", 30, seed=3)
    fedq = FedQ(2, 2, 2, 2, "hoeffding")
    ledger, streams = Ledger(), Streams(3)
    fed = FedQFederation(mdp, fedq, Channel(ledger, streams), streams)
    state, done, ends, regret = fedq.init(), 0, [], 0.0
    while done < 30:
        state, record = fed.run_round(state, len(ends) + 1, 30 - done)
        done += record.episodes
        regret += record.regret
        ends.append(done)
    assert path.episodes.tolist() == ends and path.rounds.tolist() == list(range(1, len(ends) + 1))
    assert path.regret[-1] == pytest.approx(regret, rel=1e-12)
    rows = ledger.rows()
    assert path.bytes_up == sum(r["bytes_sent"] for r in rows if r["direction"] == Direction.UP.value)
    assert path.bytes_down == sum(r["bytes_sent"] for r in rows if r["direction"] == Direction.DOWN.value)


def test_instances_only_adds_its_key_to_the_saved_results_and_keeps_the_others(tmp_path, monkeypatch):
    bench = load_benchmark("fedq")
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    with pytest.raises(SystemExit):  # nothing saved yet: a clear error before any work
        bench.main(["--instances-only"])
    saved = {"command": "old", "paths": 10, "iclr": {"a": 1}, "round_slopes": {"M": {"2": 6.6}}}
    path = tmp_path / "benchmarks" / "results" / "fedq.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(saved))
    micro = bench.Scale(
        paths=1,
        iclr_episodes=20,
        icml_episodes={},
        icml_agents=(1,),
        sweep_episodes=100,
        sweep_values=(2,),
        instances=5,  # the protocol's least number of report seeds (here instances) for a claim
        instance_paths=1,
        windows=(),
    )
    written = []
    monkeypatch.setattr(bench, "FULL", micro)
    monkeypatch.setattr(bench, "write_docs", written.append)
    assert bench.main(["--instances-only"]) == 0
    results = json.loads(path.read_text())
    assert {k: results[k] for k in saved} == saved
    assert set(results) == {*saved, "instances", "protocol"} and results["instances"]["count"] == 5
    assert results["protocol"] == {
        "selection": "none",
        "tuning_seeds": [],
        "report_seeds": [0, 1, 2, 3, 4],
        "configs_per_method": dict.fromkeys(
            ["FedQ-H (M=10)", "FedQ-B (M=10)", "UCB-H (M=1)", "UCB-B (M=1)"], 1
        ),
    }
    assert [set(w) for w in written] == [set(results)] and (
        tmp_path / "docs" / "img" / "fedq_instances.png"
    ).exists()

"""The FedQ benchmark's pipeline at micro scale (the numbers live in docs/benchmarks.md)."""

import io

from rich.console import Console

from tests.benchmark_module import load_benchmark


def test_the_benchmark_produces_the_issue_schema_plots_and_docs_at_micro_scale(tmp_path):
    bench = load_benchmark("fedq")
    scale = bench.Scale(
        paths=1,
        iclr_episodes=40,
        icml_episodes={"H=2,S=2,A=2": 150, "H=5,S=3,A=2": 60},
        icml_agents=(1, 2),
        sweep_episodes=250,
        sweep_values=(2, 4),
    )
    results = bench.run(scale, tmp_path, Console(file=io.StringIO()))
    assert {k: set(v) for k, v in results["round_slopes"].items()} == {q: {"2", "4"} for q in "MSA"}
    assert {k: set(v) for k, v in results["regret"].items()} == {s: {"1", "2"} for s in bench.SETTINGS}
    assert all(r > 0 for by_m in results["regret"].values() for r in by_m.values())
    names = set(results["iclr"]["normalised_regret"])
    assert names == {"FedQ-H (M=10)", "FedQ-B (M=10)", "UCB-H (M=1)", "UCB-B (M=1)"}
    for png in ("fedq_iclr.png", "fedq_icml_regret.png", "fedq_icml_rounds.png"):
        assert (tmp_path / png).stat().st_size > 1000
    text = bench.markdown(results)
    assert text.startswith(bench.SECTION) and bench.COMMAND in text and "| FedQ-H (M=10) |" in text

"""The demo is benchmarks/frontier.py's verdict made visible (issue 43): its two embedded configs
are exactly what `python benchmarks/frontier.py --write-demo DIR` writes from the committed
results (taciturn's best configuration at setting B's highest target beside the best uncompressed
baseline), on one workload for the same rounds, keeping one checkpoint each."""

import json

from taciturn.cli import DEMO_CONFIGS, _demo_config
from taciturn.experiments import types
from tests.benchmark_module import load_benchmark


def test_the_demo_configs_are_the_frontiers_choices_in_the_committed_results():
    frontier = load_benchmark("frontier")
    results = json.loads((frontier.RESULTS / "frontier.json").read_text())
    written = frontier.demo_configs(results)
    assert sorted(DEMO_CONFIGS) == sorted(written)
    for name in DEMO_CONFIGS:
        assert _demo_config(name).read_text() == written[name], f"{name}: rerun --write-demo"


def test_demo_runs_share_workload_and_round_budget_and_keep_one_checkpoint():
    baseline, winner = (types.load(_demo_config(name)) for name in DEMO_CONFIGS)
    assert (baseline.name, winner.name) == ("demo-baseline", "demo-winner")
    assert baseline.rounds == winner.rounds
    for part in ("data", "partition", "model", "eval", "seed"):
        assert getattr(baseline, part) == getattr(winner, part), part
    assert baseline.checkpoint.keep == winner.checkpoint.keep == 1
    assert not baseline.compression.enabled  # the best *uncompressed* baseline

"""The scale-out benchmark's parity figure (the timings live in docs/benchmarks.md)."""

import json

from tests.benchmark_module import load_benchmark


def test_parity_is_the_largest_metric_difference_but_not_the_clock(tmp_path):
    rows = {
        "ray": [{"round": 0, "accuracy": 0.5, "loss": 1.25, "wall_s": 9.0, "train_loss": None}],
        "parallel": [{"round": 0, "accuracy": 0.5, "loss": 1.0, "wall_s": 1.0, "train_loss": None}],
    }
    for name, metrics in rows.items():
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in metrics) + "\n")
    assert load_benchmark("scaleout").parity(str(tmp_path / "ray"), str(tmp_path / "parallel")) == 0.25

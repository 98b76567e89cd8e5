"""The pieces of benchmarks/wide_fedavg.py that decide what lands in the docs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import wide_fedavg
from docs_section import replace_titled_section


def test_fit_slope_recovers_a_power_law():
    widths = [64, 128, 256, 512]
    assert wide_fedavg.fit_slope(widths, [3.0 * n**-0.5 for n in widths]) == pytest.approx(-0.5)


def test_the_docs_section_is_replaced_and_the_others_kept(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n## Other\nkeep me\n\n## Wide FedAvg: old\nstale\n\n## Later\nkeep too\n")
    replace_titled_section("Wide FedAvg", "## Wide FedAvg: new\nfresh\n", docs)
    text = docs.read_text()
    assert "stale" not in text and "## Wide FedAvg: new\nfresh\n\n## Later" in text
    assert text.index("keep me") < text.index("fresh") < text.index("keep too")
    empty = tmp_path / "none.md"
    replace_titled_section("Wide FedAvg", "## Wide FedAvg: new\n", empty)
    assert empty.read_text() == "# Benchmarks\n\n## Wide FedAvg: new\n"


def test_the_full_scale_is_the_issue_s_and_configs_validate():
    full = wide_fedavg.FULL
    assert full.widths == (64, 128, 256, 512, 1024, 2048, 4096) and full.taus == (2, 5)
    assert full.multipliers == (1, 2, 4, 16, 32) and len(full.seeds) == 3
    config = wide_fedavg.theory_config(64, 5, 0, full)
    assert config.loss == "mse" and config.model.parameterization == "ntk" and config.analysis.centralized
    assert config.algorithm.local.batch_size >= config.data.train_size  # full-batch GD, twin included
    practical = wide_fedavg.practical_config(32, "non-iid", full)
    assert practical.model.hidden == (6400,) and practical.partition.alpha == 0.1


def test_the_shipped_wide_config_is_the_benchmark_s_theory_setting():
    from taciturn.experiments.config import load_config

    path = Path(__file__).resolve().parent.parent / "src/taciturn/experiments/configs/wide.toml"
    shipped = load_config(path)
    bench = wide_fedavg.theory_config(512, 5, 0, wide_fedavg.FULL)
    for part in ("data", "partition", "model", "algorithm", "analysis"):
        assert getattr(shipped, part) == getattr(bench, part), part
    assert shipped.loss == bench.loss and shipped.rounds == bench.rounds


def test_practical_gap_uses_the_lr_tuned_on_iid_and_a_t_interval_over_seeds():
    import dataclasses
    import math

    class Finished:  # a run directory whose last evaluation has this accuracy
        def __init__(self, accuracy):
            self.accuracy = accuracy

        def read_metrics(self):
            return [{"accuracy": 0.0}, {"accuracy": self.accuracy}]

    scale = dataclasses.replace(
        wide_fedavg.QUICK, multipliers=(1,), practical_seeds=(0, 1, 2), practical_lrs=(0.1, 0.3), last_evals=1
    )
    key = wide_fedavg.practical_key
    runs = {key(1, 0.1, s, "iid"): Finished(0.8) for s in range(3)}
    runs |= {key(1, 0.3, s, "iid"): Finished(a) for s, a in enumerate((0.9, 0.85, 0.95))}
    assert wide_fedavg.tuned_lrs(scale, runs) == {1: 0.3}
    runs |= {key(1, 0.3, s, "non-iid"): Finished(0.8) for s in range(3)}
    row = wide_fedavg.practical_table(scale, runs, {1: 0.3})[1]
    assert row["gap_per_seed"] == pytest.approx([10.0, 5.0, 15.0])
    half = 4.30265 * 5 / math.sqrt(3)  # s = 5 over 3 seeds, t_{0.975, 2} = 4.30265
    assert row["gap_points"] == pytest.approx(10.0) and row["gap_ci"] == pytest.approx(
        [10 - half, 10 + half], abs=1e-4
    )

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

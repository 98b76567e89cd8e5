"""The Ferret benchmark's statistics: seed-stratified per-example bootstrap and its conclusions."""

import numpy as np
import pytest

from tests.benchmark_module import load_benchmark


def examples(rouge, loss_sum, tokens):
    return {"rougeL": rouge, "exact": [0.0] * len(rouge), "loss_sum": loss_sum, "tokens": tokens}


def test_seed_means_weight_the_loss_by_tokens_within_a_seed_and_average_seeds():
    bench = load_benchmark("ferret")
    by_seed = [
        examples([0.0, 1.0], [2.0, 10.0], [1.0, 4.0]),
        examples([0.5, 0.5, 0.5], [3.0, 3.0, 3.0], [1, 1, 1]),
    ]
    # seed 0: 12 / 5 = 2.4; seed 1: 9 / 3 = 3.0 -> 2.7; Rouge-L: (0.5 + 0.5) / 2
    assert bench.seed_means(by_seed, "test_loss") == pytest.approx(2.7)
    assert bench.seed_means(by_seed, "rougeL") == pytest.approx(0.5)
    picks = [np.array([1, 1]), np.array([0, 0, 0])]
    assert bench.seed_means(by_seed, "test_loss", picks) == pytest.approx((20 / 8 + 3.0) / 2)


def test_paired_differences_cancel_what_methods_share_and_conclusions_follow_the_interval():
    bench = load_benchmark("ferret")
    rng = np.random.default_rng(0)
    noisy = [examples(list(rng.random(30)), list(rng.random(30) * 5), [1.0] * 30) for _ in range(3)]
    shifted = [{**ex, "rougeL": [r + 0.01 for r in ex["rougeL"]]} for ex in noisy]
    bench.BOOTSTRAP = 300  # the identities below hold for any number of resamples
    stats = bench.bootstrap({"fedavg": noisy, "same": noisy, "shifted": shifted}, np.random.default_rng(1))
    # every resample pairs the same examples: an identical method differs by exactly 0, a shifted
    # one by exactly its shift, though each method's own interval is wide
    assert stats["same"]["rougeL_minus_fedavg"] == (0.0, [0.0, 0.0])
    diff, (lo, hi) = stats["shifted"]["rougeL_minus_fedavg"]
    assert diff == pytest.approx(0.01) and lo == pytest.approx(0.01) and hi == pytest.approx(0.01)
    lo, hi = stats["fedavg"]["rougeL"][1]
    assert hi - lo > 0.1
    split = {
        "methods": {
            "shifted": {
                "rougeL_minus_fedavg": 0.01,
                "rougeL_minus_fedavg_ci": [0.01, 0.01],
                "test_loss_minus_fedavg": 0.2,
                "test_loss_minus_fedavg_ci": [-0.1, 0.5],
            }
        }
    }
    lines = bench.conclusions(split)
    assert "shifted is better than FedAvg on Rouge-L" in lines[0]
    assert "no conclusion on held-out loss" in lines[1]
    assert "not a claim" in bench.conclusions(split, "smoke")[0]

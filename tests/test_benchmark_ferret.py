"""The Ferret benchmark under the protocol: lr tuning pieces, report pieces, intervals over seeds."""

import dataclasses
import sys

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


def test_differences_are_paired_within_every_draw_and_over_seeds():
    """The hierarchical bootstrap draws seeds, then examples, the same for every method: an
    identical method differs by exactly 0 and a shifted one by exactly its shift in every draw,
    though each method's own interval is wide; over seeds the paired t-interval says the same."""
    bench = load_benchmark("ferret")
    rng = np.random.default_rng(0)
    noisy = [examples(list(rng.random(30)), list(rng.random(30) * 5), [1.0] * 30) for _ in range(3)]
    shifted = [{**ex, "rougeL": [r + 0.01 for r in ex["rougeL"]]} for ex in noisy]
    bench.BOOTSTRAP = 300  # the identities below hold for any number of resamples
    stats = bench.statistics({"fedavg": noisy, "same": noisy, "shifted": shifted})
    assert stats["same"]["rougeL_minus_fedavg"] == (0.0, [0.0, 0.0])
    diff, (lo, hi) = stats["shifted"]["rougeL_minus_fedavg"]
    assert diff == pytest.approx(0.01) and lo == pytest.approx(0.01) and hi == pytest.approx(0.01)
    test = stats["shifted"]["rougeL_minus_fedavg_paired"]
    assert test["ci"] == pytest.approx([0.01, 0.01]) and test["direction"] == 1 and test["n"] == 3
    assert test["wilcoxon_p"] == pytest.approx(0.25)  # three positive signs: 2 / 2^3
    lo, hi = stats["fedavg"]["rougeL"][1]
    assert hi - lo > 0.05  # the seeds' spread and the examples' both in it
    # Ferret is the second baseline: FedKSeed's and per-client seeds' rows are paired with it too
    stats = bench.statistics({"fedavg": noisy, "ferret": shifted, "same": noisy})
    diff, (lo, hi) = stats["same"]["rougeL_minus_ferret"]
    assert diff == pytest.approx(-0.01) and lo == pytest.approx(-0.01) and hi == pytest.approx(-0.01)
    assert "rougeL_minus_ferret" not in stats["ferret"] and "rougeL_minus_fedavg" in stats["ferret"]
    assert not any("minus" in key for key in stats["fedavg"])  # FedAvg against Ferret is Ferret's row
    one_seed_worse = [noisy[0], *shifted[1:]]  # better by 0.01 in seeds 1-2, equal in seed 0
    stats = bench.statistics({"fedavg": noisy, "other": one_seed_worse})
    assert stats["other"]["rougeL_minus_fedavg_by_seed"] == pytest.approx([0.0, 0.01, 0.01])
    assert stats["other"]["rougeL_minus_fedavg_paired"]["direction"] == 0  # over 3 seeds: no conclusion


def comparison(diff, ci, per_seed, t_ci, direction, power=None):
    return {
        "": diff,
        "_ci": ci,
        "_by_seed": per_seed,
        "_paired": {"ci": t_ci, "direction": direction, "wilcoxon_p": 0.25},
        "_seeds_for_power": power,
    }


def test_a_direction_needs_both_the_hierarchical_and_the_seed_level_interval():
    bench = load_benchmark("ferret")
    rows = {
        "rougeL_minus_fedavg": comparison(0.01, [0.005, 0.02], [0.01, 0.012, 0.008], [0.004, 0.016], 1),
        # the bootstrap excludes 0, the seeds do not: issue 42's FedKSeed against Ferret
        "test_loss_minus_fedavg": comparison(0.2, [0.05, 0.5], [0.6, -0.2, 0.2], [-0.8, 1.2], 0, 14),
        "test_loss_minus_ferret": comparison(0.3, [0.1, 0.5], [0.3, 0.2, 0.4], [0.05, 0.55], 1),
    }
    split = {
        "methods": {"shifted": {f"{key}{end}": v for key, row in rows.items() for end, v in row.items()}}
    }
    lines = bench.conclusions(split)
    assert "shifted is better than FedAvg on Rouge-L" in lines[0]
    assert "no conclusion on held-out loss between shifted and FedAvg" in lines[1]
    assert lines[1].endswith("a paired test would need 14 seeds to detect a difference this size.")
    assert "shifted is worse than Ferret on held-out loss" in lines[2] and len(lines) == 3
    assert (
        "over seeds paired t [+0.050, +0.550], Wilcoxon p = 0.25; per seed +0.300, +0.200, +0.400."
        in lines[2]
    )
    assert "not a claim" in bench.conclusions(split, "smoke")[0]


# ----- the speed run (--speed) -----
def timed_run(seconds, parts):
    return {
        "s_by_round": seconds,
        "s_parts_by_round": parts,
        "peak_rss_gib": 1.25,
        "bytes_up_per_client_round": 10.0,
        "bytes_down_per_client_round": 20.0,
        "settings": {},
    }


def speed_runs():
    fedavg = timed_run([10.0, 4.0, 6.0], [{"local training": t} for t in (8.0, 3.0, 5.0)])
    ferret = timed_run(
        [20.0, 7.0, 8.0],
        [
            {"local training": 10.0, "projection": 3.0, "reconstruction": 1.0},
            {"local training": 3.0, "projection": 1.0, "reconstruction": 0.5},
            {"local training": 4.0, "projection": 2.0, "reconstruction": 0.5},
        ],
    )
    ferret["catch_ups_from_cache"] = 4
    fedkseed = timed_run([50.0, 30.0, 40.0], [{"local training": 0.0}] * 3)
    return {"fedavg": fedavg, "ferret": ferret, "fedkseed": fedkseed}


def test_after_first_is_the_median_of_the_rounds_after_round_one():
    bench = load_benchmark("ferret")
    assert bench.after_first([100.0, 3.0, 5.0, 4.0]) == 4.0
    assert bench.after_first([100.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError, match="at least 2"):
        bench.after_first([1.0])


def test_speed_summary_keeps_round_one_apart_and_takes_each_part_median_on_its_own():
    bench = load_benchmark("ferret")
    summary = bench.speed_summary(speed_runs(), "full")
    ferret = summary["methods"]["ferret"]
    # other = round - timed parts: 20 - 14 = 6, 7 - 4.5 = 2.5, 8 - 6.5 = 1.5
    assert ferret == {
        "s_round_1": 20.0,
        "s_per_round": 7.5,
        "s_by_round": [20.0, 7.0, 8.0],
        "s_per_round_parts": {"local training": 3.5, "projection": 1.5, "reconstruction": 0.5, "other": 2.0},
        "s_parts_by_round": [
            {"local training": 10.0, "projection": 3.0, "reconstruction": 1.0, "other": 6.0},
            {"local training": 3.0, "projection": 1.0, "reconstruction": 0.5, "other": 2.5},
            {"local training": 4.0, "projection": 2.0, "reconstruction": 0.5, "other": 1.5},
        ],
        "peak_rss_gib": 1.25,
        "bytes_up_per_client_round": 10.0,
        "bytes_down_per_client_round": 20.0,
        "settings": {},
        "catch_ups_from_cache": 4,
        "s_per_round_ratio_to_fedavg": 1.5,  # 7.5 / median(4, 6)
    }
    fedavg = summary["methods"]["fedavg"]
    assert fedavg["s_per_round_parts"] == {"local training": 4.0, "other": 1.0}
    assert fedavg["s_per_round_ratio_to_fedavg"] == 1.0
    assert summary["methods"]["fedkseed"]["s_per_round_parts"] == {"local training": 0.0, "other": 35.0}
    assert list(summary) == ["target", "fedkseed_over_ferret_s_per_round", "methods"]
    assert summary["target"] == {"ferret_over_fedavg_at_most": 1.5, "ferret_over_fedavg": 1.5, "held": True}
    assert summary["fedkseed_over_ferret_s_per_round"] == pytest.approx(35.0 / 7.5)
    # a smoke run does not assess a target set for SmolLM2-135M
    assert bench.speed_summary(speed_runs(), "smoke")["target"]["held"] is None


def test_the_ratio_to_fedavg_is_taken_within_each_seed_so_a_slower_machine_cancels():
    bench = load_benchmark("ferret")
    fedavg = {0: {"s_per_round": 10.0}, 1: {"s_per_round": 30.0}}  # seed 1 ran on a 3x slower machine
    ferret = {0: {"s_per_round": 20.0}, 1: {"s_per_round": 30.0}}
    # per seed 2.0 and 1.0, geometric mean sqrt(2); pooling the seconds would give 50 / 40 = 1.25
    assert bench.ratio_within_seeds(ferret, fedavg) == pytest.approx(2.0**0.5)
    assert bench.ratio_within_seeds(fedavg, fedavg) == 1.0
    # a timing variant run on seed 0 only is compared with seed 0's FedAvg, not the seeds' mean
    assert bench.ratio_within_seeds({0: {"s_per_round": 30.0}}, fedavg) == pytest.approx(3.0)


def test_speed_verdict_states_whether_the_target_held_and_labels_the_evidence():
    bench = load_benchmark("ferret")
    held = {"ferret_over_fedavg_at_most": 1.5, "ferret_over_fedavg": 1.5, "held": True}
    assert bench.speed_verdict(held, "full", 3) == (
        "**The 1.5x target held in this run**: a Ferret round took 1.500x a FedAvg round "
        "(target: at most 1.5x; one seed, the median of rounds 2-3, no interval)."
    )
    missed = {"ferret_over_fedavg_at_most": 1.5, "ferret_over_fedavg": 1.6125, "held": False}
    assert bench.speed_verdict(missed, "full", 5) == (
        "**The 1.5x target did not hold in this run**: a Ferret round took 1.613x a FedAvg round "
        "(target: at most 1.5x; one seed, the median of rounds 2-5, no interval)."
    )
    smoke = {**missed, "held": None}
    assert bench.speed_verdict(smoke, "smoke", 3) == (
        "Smoke run on a tiny random model: a Ferret round took 1.613x a FedAvg round here. "
        "The 1.5x target is about SmolLM2-135M and this run does not assess it."
    )


def test_speed_docs_block_tables_every_method_and_says_it_is_no_quality_claim():
    bench = load_benchmark("ferret")
    results = {
        "command": "python benchmarks/ferret.py --speed",
        "scale": "full",
        "model": "M",
        "params": 1000,
        "seed": 0,
        "clients": 17,
        "clients_per_round": 5,
        "rounds": 3,
        "order": ["fedavg", "ferret", "fedkseed"],
        "threads": 2,
        "cores": 2,
        "load_average": {"before": 0.5, "after": 1.0},
        **bench.speed_summary(speed_runs(), "full"),
    }
    body = bench.speed_body(results, "ferret_speed.json")
    assert "**A speed measurement on one seed, not a claim about quality**" in body
    assert "| ferret | 20.00 | 7.50 | 1.50 | 1.50 | 0.50 | 3.50 | 2.00 | 1.25 | 10 / 20 |" in body
    assert "| fedavg | 10.00 | 5.00 | 1.00 |  |  | 4.00 | 1.00 | 1.25 | 10 / 20 |" in body
    assert bench.speed_verdict(results["target"], "full", 3) in body
    # Ferret's shares of its median round, 7.5 s
    assert "projection 1.50 s (20%)" in body and "other 2.00 s (27%)" in body


# ----- pieces: the quality run kept piece by piece across sessions -----
def small_scale(bench):
    """The smoke protocol cut to one split, one round, the three methods the report's ratios need,
    one lr each on one tuning seed and two report seeds: the tiny random model, seconds of CPU."""
    quick = bench.QUICK
    return dataclasses.replace(
        quick,
        splits={"ni": quick.splits["ni"]},
        rounds=1,
        seeds=(0, 1),
        methods={k: quick.methods[k] for k in ("ferret", "fedkseed", "fedavg")},
        lrs={"ferret": (0.05,), "fedkseed": (1e-4,), "fedavg": (0.02, 0.05)},
        timing_only=(),
    )


def test_tuning_pieces_choose_the_lr_then_report_pieces_read_back_give_the_report_as_computed(tmp_path):
    bench = load_benchmark("ferret")
    bench.BOOTSTRAP = 50
    scale, log = small_scale(bench), tmp_path / "runs.jsonl"
    tuning = bench.pieces(scale, {})  # until the tuning is stored, the report pieces do not exist
    assert [(p.seed, p.method, p.lr) for p in tuning] == [
        (100, "ferret", 0.05),
        (100, "fedkseed", 1e-4),
        (100, "fedavg", 0.02),
        (100, "fedavg", 0.05),
    ]
    tuned = bench.run_pieces(scale, tuning, log)
    assert all("examples" not in r for r in tuned.values())  # the held-out loss chooses: no generation
    lrs = bench.chosen_lrs(scale, tuned)
    losses = {
        lr: tuned[bench.Piece("ni", 100, "fedavg", lr)]["test_loss_by_round"][-1] for lr in (0.02, 0.05)
    }
    assert lrs["ni"]["fedavg"] == min(losses, key=losses.get)
    wanted = [p for p in bench.pieces(scale, tuned) if p not in tuned]
    assert [(p.seed, p.method) for p in wanted] == [
        (s, m) for s in (0, 1) for m in ("initial", "ferret", "fedkseed", "fedavg")
    ]
    assert all(p.lr == (None if p.method == "initial" else lrs["ni"][p.method]) for p in wanted)
    computed = bench.run_pieces(scale, wanted, log)
    assert list(computed) == wanted and len(log.read_text().splitlines()) == 12
    read = bench.stored(scale, log)
    assert read == tuned | computed  # every number, timings included, survives the JSON line exactly
    results = bench.report(scale, read)
    assert results == bench.report(scale, tuned | computed)
    assert results["protocol"]["tuning_seeds"] == [100] and results["protocol"]["report_seeds"] == [0, 1]
    assert results["protocol"]["configs_per_method"] == {"ferret": 1, "fedkseed": 1, "fedavg": 2}
    assert (results["seeds"], results["rounds"]) == (2, 1) and results["clients_per_round"] == 5
    assert {"model", "params", "clients", "methods", "ratios", "lrs", "tuning_loss"} <= set(results)
    for name, m in results["methods"].items():
        low, high = m["rougeL_ci"]
        assert low <= m["rougeL"] <= high and m["test_loss_ci"][0] <= m["test_loss"] <= m["test_loss_ci"][1]
        assert m["rounds"] == 1 and m["s_per_round_ratio_to_fedavg"] > 0, name
        assert {"exact_match", "bytes_up_per_client_round", "peak_rss_gib", "settings"} <= set(m), name
    assert results["methods"]["fedavg"]["s_per_round_ratio_to_fedavg"] == 1.0
    assert bench.run_pieces(scale, tuning + wanted, log) == {}  # a rerun reads them back, runs nothing


def test_a_piece_whose_config_or_code_changed_is_not_reused(tmp_path, monkeypatch):
    bench = load_benchmark("ferret")
    scale, log = small_scale(bench), tmp_path / "runs.jsonl"
    fedavg = [p for p in bench.pieces(scale, {}) if p.method == "fedavg"]
    bench.run_pieces(scale, fedavg, log)
    assert set(bench.stored(scale, log)) == set(fedavg)
    local = {**scale.methods["fedavg"]["local"], "batch_size": 2}
    changed = dataclasses.replace(
        scale, methods={**scale.methods, "fedavg": {"name": "fedavg", "local": local}}
    )
    assert bench.stored(changed, log) == {}  # the batch size is in the key
    other_lrs = dataclasses.replace(scale, lrs={**scale.lrs, "fedavg": (0.02, 0.1)})
    assert [p.lr for p in bench.stored(other_lrs, log)] == [0.02]  # each lr is its own piece
    longer = dataclasses.replace(scale, rounds=2)
    assert bench.stored(longer, log) == {}  # the rounds are in every config
    monkeypatch.setattr(sys.modules["run_key"], "CODE_VERSION", "another version of src/taciturn")
    assert bench.stored(scale, log) == {}


def test_missing_pieces_are_listed_as_commands_with_the_estimate_from_the_per_round_figures():
    bench = load_benchmark("ferret")
    full = bench.FULL
    # tuning, per split: 3 lrs x (FedAvg 460 + Ferret 450 + per-client seeds 520 + FedKSeed 1,500) =
    # 8,790 s (10 rounds x s/round + 120 s of evaluation per piece), two splits: 17,580 s
    assert sum(bench.estimate_s(full, p) for p in bench.tuning_pieces(full)) == 17_580
    # report, per split and seed: initial 60 s, then one piece per method: 2,990 s; 10 of them, plus
    # the two timing-only variants on ni seed 0 (530 + 470): 30,900 s
    lrs = {split: dict.fromkeys(full.methods, 1e-3) for split in full.splits}
    report = bench.report_pieces(full, lrs)
    assert sum(bench.estimate_s(full, p) for p in report) == 30_900
    missing = [p for p in report if p.split == "dolly" and p.seed == 2]
    missing += [p for p in report if (p.split, p.seed, p.method) == ("ni", 0, "initial")]
    assert bench.missing_report(full, missing).splitlines() == [
        "6 pieces missing; the report is written when every piece is stored:",
        "  --split dolly --seeds 2 --methods fedavg,fedkseed,ferret,ferret_per_client  (estimate: 50 min)",
        "  --split ni --seeds 0  (estimate: 1 min)",
        "estimated 0.8 h in all (per-round timings of the speed run; evaluation guessed)",
    ]

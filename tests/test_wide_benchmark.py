"""The pieces of benchmarks/wide_fedavg.py that decide what lands in the docs."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import wide_fedavg


def test_fit_slope_recovers_a_power_law():
    widths = [64, 128, 256, 512]
    assert wide_fedavg.fit_slope(widths, [3.0 * n**-0.5 for n in widths]) == pytest.approx(-0.5)


def test_the_full_scale_is_the_issue_s_and_configs_validate():
    full = wide_fedavg.FULL
    assert full.widths == (64, 128, 256, 512, 1024, 2048, 4096) and full.taus == (2, 5)
    assert full.multipliers == (1, 2, 4, 16, 32) and len(full.seeds) == 5
    # issue 42: lr chosen on tuning seeds, the gap reported on ten others
    assert (
        not set(full.practical_tuning_seeds) & set(full.practical_seeds) and len(full.practical_seeds) == 10
    )
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


def test_the_lr_grid_widens_toward_a_winning_edge_until_the_best_is_inside_or_the_ladder_ends():
    scale = dataclasses.replace(
        wide_fedavg.QUICK,
        practical_lrs=(0.03, 0.1, 0.3),
        practical_lr_ladder=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
    )
    asked = []

    def tuning(accuracy_by_lr):
        def iid_accuracy(lr):
            asked.append(lr)
            return accuracy_by_lr[lr]

        asked.clear()
        return wide_fedavg.tune_lr(scale, iid_accuracy)

    # the best inside the grid: nothing more is run
    assert tuning({0.03: 0.7, 0.1: 0.9, 0.3: 0.8}) == (0.1, [0.03, 0.1, 0.3]) and asked == [0.03, 0.1, 0.3]
    # the top edge wins, then 1.0 loses to it: 0.3 has a tried neighbour on each side
    assert tuning({0.03: 0.7, 0.1: 0.8, 0.3: 0.9, 1.0: 0.85}) == (0.3, [0.03, 0.1, 0.3, 1.0])
    assert asked == [0.03, 0.1, 0.3, 1.0]
    # the top edge keeps winning: the grid widens to the ladder's end and stops there
    rising = {0.03: 0.1, 0.1: 0.2, 0.3: 0.3, 1.0: 0.4, 3.0: 0.5}
    assert tuning(rising) == (3.0, [0.03, 0.1, 0.3, 1.0, 3.0]) and asked[-1] == 3.0
    # the bottom edge wins: the grid widens downward
    assert tuning({0.01: 0.85, 0.03: 0.9, 0.1: 0.8, 0.3: 0.7}) == (0.03, [0.01, 0.03, 0.1, 0.3])


def test_a_grid_off_the_ladder_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="must all lie on practical_lr_ladder"):
        dataclasses.replace(wide_fedavg.QUICK, practical_lrs=(0.2,), practical_lr_ladder=(0.1, 0.3))


def test_practical_gap_uses_the_tuned_lr_and_a_t_interval_over_seeds():
    import math

    def finished(accuracy):  # a run's summary whose last evaluation has this accuracy
        return {"round": [0, 2], "accuracy": [0.0, accuracy]}

    scale = dataclasses.replace(wide_fedavg.QUICK, multipliers=(1,), practical_seeds=(0, 1, 2), last_evals=1)
    key = wide_fedavg.practical_key
    runs = {key(1, 0.1, s, "iid"): finished(0.8) for s in range(3)}  # not the tuned lr: must not count
    runs |= {key(1, 0.3, s, "iid"): finished(a) for s, a in enumerate((0.9, 0.85, 0.95))}
    runs |= {key(1, 0.3, s, "non-iid"): finished(0.8) for s in range(3)}
    row = wide_fedavg.practical_table(scale, runs, {1: 0.3}, {1: [0.1, 0.3, 1.0]})[1]
    assert row["gap_per_seed"] == pytest.approx([10.0, 5.0, 15.0]) and row["lrs_tried"] == [0.1, 0.3, 1.0]
    half = 4.30265 * 5 / math.sqrt(3)  # s = 5 over 3 seeds, t_{0.975, 2} = 4.30265
    assert row["gap_points"] == pytest.approx(10.0) and row["gap_ci"] == pytest.approx(
        [10 - half, 10 + half], abs=1e-4
    )


def test_theory_summary_averages_divergence_over_trained_rounds_and_takes_the_rest_at_the_end(monkeypatch):
    class Run:
        def read_metrics(self):
            common = {"loss": 0.0, "centralized_loss": 0.0, "accuracy": 0.0, "centralized_accuracy": 0.0}
            rows = [{"divergence": None, "ntk_change": 0.0, "linearization_rmse": 0.0, "weight_change": 0.0}]
            rows += [
                {"divergence": d, "ntk_change": d / 10, "linearization_rmse": d / 100, "weight_change": d}
                for d in (1.0, 2.0, 6.0)
            ]
            return [{**common, **r} for r in rows]

    floor = {"output_rmse_at_end": 0.5, "floor": 0.25, "nonlinear": 0.125, "linearized_fedavg_rmse": 0.0625}
    monkeypatch.setattr(wide_fedavg, "kernel_comparisons", lambda config, rundir: floor)
    summary = wide_fedavg.theory_summary(None, Run())
    assert summary["divergence"] == 3.0  # (1 + 2 + 6) / 3: round 0 has no divergence
    assert (summary["ntk_change"], summary["linearization_rmse"], summary["weight_change"]) == (
        0.6,
        0.06,
        6.0,
    )
    assert {k: summary[k] for k in floor} == floor


def test_theory_table_means_over_seeds_then_fits_the_slope_against_width():
    """Two seeds at width 64 average to 2/8, the widest's one seed is 2/16: slope log(1/2)/log(4) = -1/2;
    one seed at a width gives no interval."""
    scale = dataclasses.replace(
        wide_fedavg.QUICK, widths=(64, 256), taus=(5,), seeds=(0, 1), seeds_widest=(0,)
    )
    values = {"n64-tau5-seed0": 0.2, "n64-tau5-seed1": 0.3, "n256-tau5-seed0": 0.125}
    columns = [column for column, _ in wide_fedavg.THEORY_QUANTITIES.values()]
    columns += ["floor", "test_loss", "centralized_test_loss"]
    summaries = {key: {c: value for c in columns} for key, value in values.items()}
    table = wide_fedavg.theory_table(scale, summaries)
    assert table["mean"][5][64]["divergence"] == pytest.approx(0.25, rel=1e-12)
    assert table["mean"][5][256]["ntk_change"] == 0.125
    assert table["slopes"][5] == pytest.approx(
        {name: -0.5 for name in wide_fedavg.THEORY_QUANTITIES}, rel=1e-12
    )
    assert table["slope_ci"][5] == {name: None for name in wide_fedavg.THEORY_QUANTITIES}
    with pytest.raises(KeyError):  # the widest width's other seeds are not read
        wide_fedavg.theory_table(dataclasses.replace(scale, seeds_widest=(0, 1)), summaries)
    layers = {64: {"input layer": 0.5}, 256: {"input layer": 0.25}}
    practical = {
        1: {
            "lr": 0.1,
            "lrs_tried": [0.1],
            "iid": 0.9,
            "non-iid": 0.8,
            "gap_points": 10.0,
            "gap_ci": [4.0, 16.0],
        }
    }
    lines = wide_fedavg.markdown(scale, table, layers, practical, "cmd", 1.0).splitlines()
    assert "| (b) client divergence (effective weights) | -0.50 | n/a (one seed) |" in lines
    assert "| 64 | 0.2500 | 0.2500 | 0.2500 | 0.2500 | 0.2500 | 0.2500 | 0.2500 | 0.2500 / 0.2500 |" in lines
    assert "| 256 | 0.1250 | 0.1250 | 0.1250 | 0.1250 | 0.1250 | 0.1250 | 0.1250 | 0.1250 / 0.1250 |" in lines
    assert "| 64 | 0.5000 |" in lines and "| 256 | 0.2500 |" in lines  # (b) by layer
    assert (
        "| 1 | 200 | 0.1 | 0.1 | 0.9000 | 0.8000 | 10 | [4, 16] | 17.4 |" in lines
    )  # a 12-point-wide interval
    widened = dataclasses.replace(scale, practical_lr_ladder=(0.01, 0.1))  # 0.1 ends the ladder: it is marked
    lines = wide_fedavg.markdown(widened, table, layers, practical, "cmd", 1.0).splitlines()
    assert "| 1 | 200 | 0.1 (ladder's edge) | 0.1 | 0.9000 | 0.8000 | 10 | [4, 16] | 17.4 |" in lines


def test_decimals_are_those_the_interval_supports():
    assert wide_fedavg.with_interval(-0.7962, [-0.86, -0.73], "+") == ("-0.8", "[-0.9, -0.7]")  # 0.13 wide
    assert wide_fedavg.with_interval(-0.7962, [-0.83, -0.75], "+") == ("-0.80", "[-0.83, -0.75]")  # 0.08
    assert wide_fedavg.with_interval(3.73, [1.2, 6.3]) == ("4", "[1, 6]")
    assert wide_fedavg.with_interval(3.73, [3.7, 3.7]) == ("3.7300", "[3.7000, 3.7000]")
    assert wide_fedavg.with_interval(-0.5, None, "+") == ("-0.50", "n/a (one seed)")


def test_against_its_linearisation_a_linear_model_s_fedavg_is_its_linearised_fedavg(tmp_path):
    """The benchmark's comparisons on real runs: a model affine in its parameters is its own Taylor
    model, so FedAvg and linearised FedAvg agree to float32 precision (and so do the centralized
    twins); a width-16 MLP moves away from its linearisation."""
    from taciturn.experiments.runner import start
    from tests.test_analysis_runs import wide_config

    linear = wide_config(steps=3, lr=0.05, model={"kind": "logreg"}, analysis={"centralized": True})
    found = wide_fedavg.kernel_comparisons(linear, start(linear, tmp_path / "linear", progress=False))
    assert found["linearized_fedavg_rmse"] < 1e-5 and found["nonlinear"] < 1e-5
    assert found["output_rmse_at_end"] > 1e-3  # client drift: three local steps on one-class clients
    assert found["floor"] == pytest.approx(found["output_rmse_at_end"], abs=1e-5)
    mlp = wide_config(steps=3, lr=0.5, analysis={"centralized": True})
    found = wide_fedavg.kernel_comparisons(mlp, start(mlp, tmp_path / "mlp", progress=False))
    assert found["linearized_fedavg_rmse"] > 1e-3


def test_a_finished_run_s_summary_is_read_back_from_the_log_instead_of_run_again(tmp_path, monkeypatch):
    """The full run spans several sessions: each run's summary lands in the log as it finishes, a
    rerun reads it back (and counts its stored seconds), another config runs, --fresh runs again."""
    scale = wide_fedavg.QUICK
    jobs = [(f"k{k}", wide_fedavg.practical_config(k, "iid", scale), tmp_path / f"k{k}") for k in (1, 2)]
    ran = []

    def fake_run(config, out, fresh):
        ran.append(config.name)
        return config.model.hidden[0]

    def practical_summary(config, width):
        return {"round": [0, 1], "accuracy": [0.1, width / 1000]}

    monkeypatch.setattr(wide_fedavg, "run", fake_run)
    log = wide_fedavg.RunLog(tmp_path / "runs.jsonl", fresh=False)
    first = wide_fedavg.run_all(jobs[:1], practical_summary, log)
    assert first == {"k1": {"round": [0, 1], "accuracy": [0.1, 0.2]}} and len(ran) == 1
    again = wide_fedavg.RunLog(log.path, fresh=False)
    both = wide_fedavg.run_all(jobs, practical_summary, again)
    assert ran == ["practical-k1-lr0.1-s0-iid", "practical-k2-lr0.1-s0-iid"]  # only k2 is new
    assert both["k1"] == first["k1"] and both["k2"]["accuracy"] == [0.1, 0.4]
    stored = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert again.seconds == pytest.approx(sum(row["seconds"] for row in stored))
    wide_fedavg.run_all(jobs[:1], practical_summary, wide_fedavg.RunLog(log.path, fresh=True))
    assert len(ran) == 3
    layers = wide_fedavg.RunLog(log.path, fresh=False)
    monkeypatch.setattr(wide_fedavg, "layer_divergence", lambda scale, out: {64: {"input layer": 0.5}})
    assert wide_fedavg.stored_layer_divergence(scale, tmp_path, layers) == {64: {"input layer": 0.5}}
    monkeypatch.setattr(wide_fedavg, "layer_divergence", lambda scale, out: pytest.fail("ran again"))
    assert wide_fedavg.stored_layer_divergence(scale, tmp_path, layers) == {64: {"input layer": 0.5}}


def test_runs_made_in_worker_processes_are_the_runs_made_here(tmp_path):
    """--jobs 2 makes the missing runs in two single-thread processes and stores each as it ends;
    seeded, they give the summaries that one thread in this process gives."""
    import torch

    scale = dataclasses.replace(wide_fedavg.QUICK, practical_rounds=2, practical_eval_every=1)
    jobs = [
        (
            f"s{seed}",
            wide_fedavg.practical_config(1, "non-iid", scale, seed),
            tmp_path / "workers" / f"s{seed}",
        )
        for seed in (0, 1)
    ]
    log = wide_fedavg.RunLog(tmp_path / "workers.jsonl", fresh=False)
    made = wide_fedavg.run_all(jobs, wide_fedavg.practical_summary, log, workers=2)
    assert {r["name"] for r in map(json.loads, log.path.read_text().splitlines())} == {
        config.name for _, config, _ in jobs
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        here = [(key, config, tmp_path / "here" / key) for key, config, _ in jobs]
        again = wide_fedavg.run_all(
            here, wide_fedavg.practical_summary, wide_fedavg.RunLog(tmp_path / "h", False)
        )
    finally:
        torch.set_num_threads(threads)
    assert made == again and made["s0"] != made["s1"]  # the same runs, and two seeds are two runs


def test_the_width_effect_is_a_paired_test_and_says_how_many_seeds_would_detect_it():
    """Issue 19's three seeds: gaps 14.4, 5.43, 5.15 at k = 1 and 7.05, 2.45, 1.68 at k = 32; per-seed
    changes 7.35, 2.98, 3.47 (mean 4.6, sd 2.39): the paired interval contains 0 (t_{0.975, 2} =
    4.303: 4.6 +- 5.95), and 80% power at that sd needs 5 seeds (d = 1.92)."""
    practical = {
        1: {"gap_per_seed": [14.4, 5.4333333, 5.15]},
        32: {"gap_per_seed": [7.05, 2.45, 1.6833333]},
    }
    out = wide_fedavg.width_effect(wide_fedavg.FULL, practical)
    assert out["paired"]["mean"] == pytest.approx(4.6, abs=1e-6)
    assert out["paired"]["ci"] == pytest.approx([4.6 - 5.9467, 4.6 + 5.9467], abs=1e-3)
    assert out["paired"]["direction"] == 0 and out["seeds_for_80_power"] == 5
    assert "no conclusion" in out["sentence"] and "would need 5 seeds" in out["sentence"]


def test_a_gap_that_shrinks_with_width_is_stated_as_the_narrow_network_doing_worse():
    """Per-seed changes 2, 3, 4 (k = 1 minus k = 32): mean 3, sd 1, t_{0.975, 2} = 4.303 gives
    3 +- 2.48, wholly above 0. The higher gap is the worse network, so the sentence must not call
    k = 1 "better" for having more of the heterogeneity's harm."""
    practical = {1: {"gap_per_seed": [7.0, 8.0, 9.0]}, 32: {"gap_per_seed": [5.0, 5.0, 5.0]}}
    out = wide_fedavg.width_effect(wide_fedavg.FULL, practical)
    assert out["paired"]["ci"] == pytest.approx([3 - 2.4841, 3 + 2.4841], abs=1e-3)
    assert out["paired"]["direction"] == 1
    assert out["sentence"].startswith("the gap at k = 1 is worse than at k = 32 on the IID minus non-IID")
    assert "would need" not in out["sentence"]  # a detected change needs no power statement


def test_the_readme_lines_state_the_intervals_at_the_decimals_they_support():
    """Hand-made results: a gap interval 4.7 wide shows whole points, one 0.09 wide two decimals;
    the narrowest and widest widths are found by number, not by the keys' text order ("16" < "2")."""
    results = {
        "practical": {
            "2": {"gap_points": 6.64, "gap_ci": [4.06, 8.76]},
            "16": {"gap_points": 3.56, "gap_ci": [3.51, 3.60]},
        },
        "gap_change": {"sentence": "GAP SENTENCE."},
        "protocol": {"tuning_seeds": [100, 101], "report_seeds": list(range(10))},
        "theory_protocol": {"report_seeds": [0, 1, 2, 3, 4]},
        "slopes_by_tau": {"2": {}, "5": {"ntk_change": -0.77, "divergence": -0.356, "output_rmse": -0.02}},
        "slope_ci_by_tau": {
            "2": {},
            "5": {"ntk_change": [-0.84, -0.72], "divergence": [-0.399, -0.313], "output_rmse": [-0.08, 0.04]},
        },
    }
    practical, theory = wide_fedavg.readme_lines(results).split("\n")
    assert (
        "gap is 7 points [4, 9] at k = 2 and 3.56 points [3.51, 3.60] at k = 16; seed by seed, GAP SENTENCE."
        in practical
    )
    assert "10 report seeds" in practical and "[100, 101]" in practical
    assert "5 seeds, tau = 5" in theory
    assert "NTK change -0.8 [-0.8, -0.7], the clients' divergence -0.36 [-0.40, -0.31]" in theory
    assert "centralized GD -0.0 [-0.1, +0.0]" in theory

"""The scale-out benchmark's pure parts: parity, the issue's layout, targets, and the cost split."""

import json

import pytest

from tests.benchmark_module import load_benchmark

scaleout = load_benchmark("scaleout")


def test_parity_is_the_largest_metric_difference_but_not_the_clock(tmp_path):
    rows = {
        "ray": [{"round": 0, "accuracy": 0.5, "loss": 1.25, "wall_s": 9.0, "train_loss": None}],
        "parallel": [{"round": 0, "accuracy": 0.5, "loss": 1.0, "wall_s": 1.0, "train_loss": None}],
    }
    for name, metrics in rows.items():
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in metrics) + "\n")
    assert scaleout.parity(str(tmp_path / "ray"), str(tmp_path / "parallel")) == 0.25


def test_summary_has_the_issue_layout_with_medians_and_none_for_what_did_not_run():
    wall = {"W": {"ray": [3.0, 1.0, 2.0], "parallel": [4.0, 6.0, 5.0], "floor": [7.0, 9.0, 8.0]}}
    assert scaleout.summary(wall) == {"W": {"ray": 2.0, "parallel": 5.0, "flower": None, "floor": 8.0}}


def test_a_failed_repetition_is_left_out_of_the_median_and_of_the_pairs():
    wall = {"W3": {"ray": [10.0, 11.0, 12.0], "parallel": [9.0, 9.0, 9.0], "flower": [40.0, None, 30.0]}}
    assert scaleout.summary(wall)["W3"]["flower"] == 35.0
    paired = scaleout.ratios(wall)["W3"]["ray/flower"]  # repetitions 1 and 3: 10 / 40 and 12 / 30
    assert paired["reps"] == 2
    assert paired["median"] == pytest.approx((0.25 + 0.4) / 2)
    assert scaleout.summary({"W": {"ray": [1.0], "flower": [None]}})["W"]["flower"] is None


def test_targets_held_by_the_median_and_claimed_only_when_the_interval_agrees():
    wall = {
        "W": {"ray": [130.0, 120.0, 125.0], "parallel": [100.0, 100.0, 100.0]},  # 1.3, 1.2, 1.25
        "W3": {"ray": [100.0, 100.0, 100.0], "parallel": [100.0, 100.0, 100.0]},  # 1.0, no spread
    }
    found = scaleout.ratios(wall)
    assert set(found) == {"W", "W3"} and "ray/flower" not in found["W3"]  # Flower did not run
    assert found["W"]["ray/parallel"]["median"] == pytest.approx(1.25)
    lines = scaleout.verdicts(found)
    # logs of 1.3, 1.2, 1.25: mean 0.2226, sem 0.0231, t(2) 4.303: [exp(0.1231), exp(0.3221)]
    assert lines[0].startswith(
        "W: ray <= 1.15x parallel: does not hold (1.250x median, 95% interval [1.131, 1.380]"
    )
    assert lines[0].endswith("straddles the target: no claim)")
    assert lines[1].startswith("W3: ray <= 1.50x parallel: holds (1.000x median, 95% interval [1.000, 1.000]")
    assert lines[1].endswith("3 reps; the whole 95% interval agrees)")
    assert lines[2] == "W3: flower >= 3x ray: not measured (flower did not run)"


def test_a_target_missed_with_one_repetition_is_no_claim_and_flower_is_shown_as_a_speed_up():
    found = scaleout.ratios(
        {
            "W": {"ray": [130.0], "parallel": [100.0]},
            "W3": {"ray": [10.0], "parallel": [9.0], "flower": [20.0]},
        }
    )
    lines = scaleout.verdicts(found)
    assert lines[0].startswith("W: ray <= 1.15x parallel: does not hold (1.300x median")
    assert lines[0].endswith("1 reps; one repetition: no interval, no claim)")
    assert lines[2].startswith("W3: flower >= 3x ray: does not hold (flower / ray 2.00x median")


def test_costs_split_the_command_into_fixed_per_round_and_per_client_parts():
    wall = {"ray": [50.0, 60.0], "parallel": [35.0, 45.0]}
    train = {"ray": [30.0, 40.0], "parallel": [28.0, 38.0]}
    found = scaleout.costs(wall, train, ready=[1.0, 1.0], rounds=10, clients=5)
    # the first round's wait for the actors is start-up: ray's rounds take 29 and 39 s
    assert found["outside_rounds_s"] == {"ray": 21.0, "parallel": 7.0}
    assert found["ray_fixed_s"] == pytest.approx(14.0)
    assert found["ray_per_round_s"] == pytest.approx(0.1)  # 1 s more over 10 rounds
    assert found["client_s"] == pytest.approx((28 * 2 / 50 + 38 * 2 / 50) / 2)  # 2 workers, 50 clients
    assert found["ray_ready_s"] == 1.0


def test_nodes_and_the_first_round_wait_come_from_the_run_log(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "2026-12-02 05:22:23,815 INFO taciturn: executor: ray with 2 workers (set in the config)\n"
        "2026-12-02 05:22:32,966 INFO taciturn.engine.ray_executor: ray: 4 workers on 2 nodes, "
        "ready 7.61 s into the first round\n"
    )
    assert scaleout.ray_start(log) == (2, 7.61)
    log.write_text("nothing about Ray\n")
    with pytest.raises(ValueError, match="does not say"):
        scaleout.ray_start(log)


def test_the_projection_scales_the_measured_client_time_and_adds_the_transfers():
    rows = scaleout.projection(client_s=0.01, params=100_000, ray_per_round_s=0.05)
    assert [r["nodes"] for r in rows] == [1, 2, 4, 8, 16, 32]
    one, four = rows[0], rows[2]
    # 0.01 s x 1000 (100M / 100k parameters) = 10 s a client; 1000 / 8 = 125 clients a worker
    assert one["train_s"] == pytest.approx(1250.0)
    # 400 MB over 10 Gb/s = 0.32 s a model; 3 x 400 MB over 10 GB/s = 0.12 s an add
    assert one["broadcast_s"] == pytest.approx(0.32)
    assert one["partials_s"] == pytest.approx(8 * (0.32 + 0.12))
    assert one["round_s"] == pytest.approx(1250.0 + 0.32 + 3.52 + 0.05)
    assert four["workers"] == 32 and four["train_s"] == pytest.approx(32 * 10.0)  # ceil(1000 / 32) = 32
    assert four["round_s"] == pytest.approx(320.0 + 4 * 0.32 + 32 * 0.44 + 0.05)
    # a Ray round measured faster than parallel's is noise, not a saving: it adds 0
    noisy = scaleout.projection(client_s=0.01, params=100_000, ray_per_round_s=-0.016)[0]
    assert noisy["ray_s"] == 0.0 and noisy["round_s"] == pytest.approx(1250.0 + 0.32 + 3.52)


def test_the_docs_section_shows_the_medians_targets_costs_and_projection():
    wall = {
        name: {"ray": [12.0, 11.0, 13.0], "parallel": [10.0, 10.0, 10.0], "floor": [20.0, 20.0, 20.0]}
        for name in ("W", "W3")
    }
    train = {"ray": [6.5, 5.5, 7.5], "parallel": [5.0, 5.0, 5.0]}
    found = scaleout.ratios(wall)
    results = scaleout.summary(wall) | {"parity_max_abs_diff": 0.0, "nodes": 1}
    results["detail"] = {
        "smoke": False,
        "repetitions": 3,
        "workers": 2,
        "flower_version": None,
        "load_before": [0.5, 1.25],
        "failed": [],
        "costs": {
            name: scaleout.costs(wall[name], train, [0.5] * 3, 10, 5)
            | {"rounds": 10, "clients": 5, "params": 100_000}
            for name in ("W", "W3")
        },
        "targets": scaleout.verdicts(found),
    }
    body = scaleout.docs_body(results, quick=False)
    assert "Failed" not in body
    results["detail"]["failed"] = ["W3 flower repetition 2"]
    assert "Failed, left out: W3 flower repetition 2." in scaleout.docs_body(results, quick=False)
    assert "3 repetitions, interleaved; Flower not installed. Ray on 1 node(s)" in body
    assert "highest 1-minute load average before a command: 1.25" in body
    assert "| W | 12.0 | 10.0 | - | 20.0 | 1.200 |" in body
    assert "* W3: flower >= 3x ray: not measured (flower did not run)" in body
    # outside the rounds: ray 6 s (0.5 s of it the first round's wait), parallel 5 s; per round
    # (6 - 5) / 10; a client 5 x 2 / 50 s
    assert "| W3 | 5.0 | 6.0 | 0.5 | 1.0 | 100 | 200 | 10 x 5 |" in body
    assert "| 1 | 8 | 25000.0 | 0.3 | 3.5 | 0.1 | 25003.9 |" in body  # 0.2 s x 1000 x 125 clients

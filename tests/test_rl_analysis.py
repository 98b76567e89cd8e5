"""The fits that summarise FedQ runs (rl/analysis.py), against values worked out by hand."""

import math

import numpy as np
import pytest

from taciturn.rl.analysis import log_slope, steady_state_slope

EPISODES = np.array([10, 100, 1000, 10000])
VALUES = np.array([0.0, 1.0, 3.0, 4.0])


def test_log_slope_fits_only_the_points_from_start_on():
    # x = ln 100, ln 1000, ln 10^4 are equally spaced (step ln 10): the least-squares slope of three
    # equally spaced points is (y_3 - y_1) / (x_3 - x_1) = (4 - 1) / (2 ln 10)
    assert log_slope(EPISODES, VALUES, 100) == pytest.approx(3 / (2 * math.log(10)), rel=1e-12)
    assert log_slope(EPISODES, VALUES, 1000) == pytest.approx(1 / math.log(10), rel=1e-12)  # two points
    # every point: slope of (0, 1, 3, 4) at x = ln 10 * (1, 2, 3, 4): sum (x - 2.5)(y - 2) / sum (x - 2.5)^2
    assert log_slope(EPISODES, VALUES, 0) == pytest.approx(7 / (5 * math.log(10)), rel=1e-12)


def test_log_slope_fits_only_the_points_inside_a_closed_window():
    # [100, 1000]: two points, (3 - 1) / ln 10; [10, 1000]: three equally spaced, (3 - 0) / (2 ln 10)
    assert log_slope(EPISODES, VALUES, 100, 1000) == pytest.approx(2 / math.log(10), rel=1e-12)
    assert log_slope(EPISODES, VALUES, 10, 1000) == pytest.approx(3 / (2 * math.log(10)), rel=1e-12)
    assert log_slope(EPISODES, VALUES, 0, 1e9) == log_slope(EPISODES, VALUES, 0)  # a window past the end
    assert math.isnan(log_slope(EPISODES, VALUES, 100, 500))  # one point inside


def test_log_slope_is_nan_without_two_distinct_points():
    assert math.isnan(log_slope(EPISODES, VALUES, 5000))  # one point
    assert math.isnan(log_slope(np.array([100, 100, 100]), np.array([1.0, 2.0, 3.0]), 0))  # one x


def test_steady_state_slope_is_one_over_log_of_one_plus_one_over_h_h_plus_1():
    assert steady_state_slope(2) == pytest.approx(1 / math.log(7 / 6), rel=1e-14)  # 1 + 1/(2*3)
    assert steady_state_slope(3) == pytest.approx(1 / math.log(13 / 12), rel=1e-14)  # 1 + 1/(3*4)

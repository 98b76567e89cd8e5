"""`auto` tries the parallel executor against the in-process one on the run's first rounds and keeps
the faster (engine/trial.py): decided from injected timings, then checked on a real run."""

from __future__ import annotations

import logging

import pytest

from taciturn.engine import choice
from taciturn.engine.pipeline import RoundPart
from taciturn.engine.trial import MARGIN, MIN_ROUNDS, TRIAL_ROUNDS, TrialExecutor
from tests.conftest import tiny_config


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Fake:
    """An executor whose round takes ``seconds[i]`` per unit of work on its i-th round served."""

    def __init__(self, name: str, clock: Clock, seconds: list[float]):
        self.name, self.clock, self.seconds = name, clock, list(seconds)
        self.pipeline = None
        self.rounds: list[int] = []
        self.commits: list[int] = []
        self.closed = False

    def serve(self, round, clients, downlink, spec):
        assert not self.closed, f"{self.name} served round {round} after it was closed"
        self.clock.now += self.seconds[len(self.rounds)] * len(clients)
        self.rounds.append(round)
        return RoundPart(accumulated=None)

    def commit(self, round, accepted):
        assert not self.closed, f"{self.name} got round {round}'s commit after it was closed"
        assert self.rounds[-1] == round, f"{self.name} got round {round}'s commit but did not serve it"
        self.commits.append(round)

    def close(self):
        self.closed = True


def trial(a_seconds, b_seconds, rounds=8):
    clock = Clock()
    a, b = Fake("sequential", clock, a_seconds), Fake("parallel", clock, b_seconds)
    executor = TrialExecutor(a, b, work=lambda clients: float(len(clients)), clock=clock)
    for r in range(1, rounds + 1):
        executor.serve(r, list(range(r % 3 + 2)), {}, {})  # rounds of 2, 3 or 4 clients
        executor.commit(r, [0])  # as the Federation does after aggregating
    return executor, a, b


def test_candidates_alternate_then_the_faster_per_unit_of_work_serves_the_rest():
    # the parallel one's first round carries the fork (5.0 s a client); its best round (0.5) wins
    executor, a, b = trial([1.0] * 8, [5.0, 0.5] + [0.5] * 6)
    assert a.rounds == [1, 3] and b.rounds == [2, 4, 5, 6, 7, 8]
    assert a.commits == a.rounds and b.commits == b.rounds  # each round's state where it was staged
    assert a.closed and not b.closed and executor.kept is b and executor.name == "parallel"


def test_a_losing_challenger_is_closed_only_after_its_last_round_is_committed():
    executor, a, b = trial([1.0] * 8, [2.0] * 8, rounds=4)
    assert b.rounds == [2, 4] and b.commits == [2, 4] and not b.closed  # round 4's state is stored
    executor.serve(5, [0, 1], {}, {})
    assert b.closed and a.rounds == [1, 3, 5]


def test_a_challenger_inside_the_margin_loses_and_is_closed():
    just_inside = MARGIN * 1.0 * 1.001  # not 3% faster: the in-process executor stays
    executor, a, b = trial([1.0] * 8, [just_inside] * 8)
    assert a.rounds == [1, 3, 5, 6, 7, 8] and b.rounds == [2, 4]
    assert b.closed and not a.closed and executor.kept is a


def test_rounds_of_different_sizes_compare_per_unit_of_work():
    # b takes more seconds a round than a only because its rounds have more clients
    clock = Clock()
    a, b = Fake("sequential", clock, [1.0] * 8), Fake("parallel", clock, [0.9] * 8)
    executor = TrialExecutor(a, b, work=lambda clients: float(len(clients)), clock=clock)
    sizes = {1: 2, 2: 4, 3: 2, 4: 4}
    for r in range(1, 5):
        executor.serve(r, list(range(sizes[r])), {}, {})
    assert clock.now == pytest.approx(2 + 4 * 0.9 + 2 + 4 * 0.9)
    executor.serve(5, [0], {}, {})  # decides before serving round 5
    assert executor.kept is b  # 0.9 s against 1.0 s a client, though its rounds took 3.6 s against 2


def test_the_decision_is_logged_with_its_numbers(caplog):
    with caplog.at_level(logging.INFO, logger="taciturn"):
        trial([2.0] * 8, [1.0] * 8)
    (line,) = [r.getMessage() for r in caplog.records if "executor trial" in r.getMessage()]
    assert f"best of {TRIAL_ROUNDS} rounds" in line and "sequential 2 s" in line
    assert "parallel 1 s (0.50x): keeping parallel" in line


def test_close_releases_only_what_is_still_open():
    executor, a, b = trial([1.0] * 2, [1.0] * 2, rounds=2)  # still trying: both open
    executor.close()
    assert a.closed and b.closed


@pytest.mark.parametrize(("rounds", "expected"), [(MIN_ROUNDS - 1, (None, 0)), (MIN_ROUNDS, ("parallel", 2))])
def test_probe_s_parallel_pick_becomes_a_trial_only_when_the_run_is_long_enough(rounds, expected):
    tried = choice.Choice("parallel", 2, "probe").tried(rounds)
    assert tried.executor == "sequential" and (tried.challenger, tried.workers) == expected
    assert choice.Choice("vectorized", 0, "x").tried(100) == choice.Choice("vectorized", 0, "x")
    assert choice.Choice("parallel_vectorized", 2, "x").tried(100).executor == "vectorized"


def test_auto_run_tries_both_and_matches_the_sequential_executor(tmp_path, monkeypatch):
    """A real run: the probe is told processes pay; the trial runs, logs, and the run's numbers are
    those of the sequential executor up to the order of partial sums."""
    from taciturn.experiments.runner import start

    monkeypatch.setattr(choice, "available_cores", lambda: 2)
    monkeypatch.setattr(choice, "_probe", lambda *a: {"all_threads": 1e-2, "one_thread": 1.0e-2})
    common = {"rounds": MIN_ROUNDS, "algorithm__name": "scaffold"}
    auto = start(tiny_config(engine={"executor": "auto"}, **common), tmp_path / "auto", progress=False)
    seq = start(tiny_config(engine={"executor": "sequential"}, **common), tmp_path / "seq", progress=False)
    log = auto.log.read_text()
    assert "executor: sequential or parallel with 2 workers" in log and "executor trial" in log
    assert "client state: DiskStateStore" in log  # SCAFFOLD's c_i must be shared with the workers
    got, want = auto.read_metrics(), seq.read_metrics()
    assert [r["round"] for r in got] == [r["round"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert g["accuracy"] == pytest.approx(w["accuracy"], abs=1e-6)
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-5)

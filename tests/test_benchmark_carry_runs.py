"""benchmarks/carry_runs.py keeps stored runs across a code change only where a rerun of each kind
reproduces its stored run exactly; one difference and nothing is carried."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_module import load_benchmark
from tests.conftest import TINY_EVENT_ADMM_SETTING

TINY = TINY_EVENT_ADMM_SETTING


@pytest.fixture
def modules(tmp_path, monkeypatch):
    carry = load_benchmark("carry_runs")
    ea = carry.ea
    monkeypatch.setattr(ea, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(ea, "RESULTS", tmp_path / "results")
    return carry, ea


def _old_log(ea, tmp_path, edit=None):
    """Three runs stored as if by earlier code (other keys): two of one kind, one of another."""
    specs = [
        ea.Spec("fedavg", (("fraction", 0.5), ("lr", 0.05)), 0),
        ea.Spec("event_admm", (("rho", 0.1), ("delta", 0.0)), 0),
        ea.Spec("fedavg", (("fraction", 0.5), ("lr", 0.05)), 1),
    ]
    for spec in specs:
        ea.run_one(TINY, spec)
    records = [json.loads(line) for line in ea.runs_log(TINY).read_text().splitlines()]
    old = tmp_path / "old.jsonl"
    lines = []
    for i, record in enumerate(records):
        record = record | {"key": f"earlier-code-{i}"}
        if edit is not None and i == edit:
            record["rows"][-1]["accuracy"] += 1e-4  # what a behaviour change would leave
        lines.append(json.dumps(record))
    old.write_text("\n".join(lines) + "\n")
    return old, records


def test_runs_are_carried_under_the_current_key_after_an_exact_rerun_of_each_kind(modules, tmp_path):
    carry, ea = modules
    old, made = _old_log(ea, tmp_path)
    new = tmp_path / "new.jsonl"
    assert carry.carry(old, new, 1, tmp_path / "carry") == 1  # the second fedavg run; the others are reruns
    records = [json.loads(line) for line in new.read_text().splitlines()]
    assert [r["name"] for r in records] == [made[0]["name"], made[1]["name"], made[2]["name"]]
    assert [r["key"] for r in records] == [ea.key_of_tree(r["config"]) for r in made]
    assert "carried" not in records[0] and "carried" not in records[1]
    assert records[2]["carried"] == {
        "from_key": "earlier-code-2",
        "verified_by": [made[0]["name"], made[1]["name"]],
    }
    assert records[2]["rows"] == made[2]["rows"]
    # the carried run is read back by the benchmark instead of being made again
    spec = ea.Spec("fedavg", (("fraction", 0.5), ("lr", 0.05)), 1)
    assert ea.key_of(TINY, spec) in ea.read_runs(new)
    assert carry.carry(old, new, 1, tmp_path / "carry") == 0  # nothing left to carry
    # carried again (another code change): the record keeps the chain back to the run that was made
    again = tmp_path / "again.jsonl"
    again.write_text("\n".join(json.dumps(r | {"key": f"later-{i}"}) for i, r in enumerate(records)) + "\n")
    newest = tmp_path / "newest.jsonl"
    assert carry.carry(again, newest, 1, tmp_path / "carry") == 1
    chain = json.loads(newest.read_text().splitlines()[-1])["carried"]
    assert chain["from_key"] == "later-2" and chain["before"]["from_key"] == "earlier-code-2"


def test_one_field_the_rerun_does_not_reproduce_carries_nothing(modules, tmp_path):
    carry, ea = modules
    old, _ = _old_log(ea, tmp_path, edit=0)  # the sampled fedavg run differs in one accuracy
    new = tmp_path / "new.jsonl"
    assert carry.carry(old, new, 1, tmp_path / "carry") is None
    records = [json.loads(line) for line in new.read_text().splitlines()]
    assert len(records) == 2 and not any("carried" in r for r in records)  # only the two reruns
    assert carry.main([str(old), str(tmp_path / "other.jsonl")]) == 1


def test_the_sample_is_the_first_run_of_each_kind_in_log_order(modules):
    carry, _ = modules

    def record(name, algorithm, compression=None):
        config = {"algorithm": {"name": algorithm}, "data": {"dataset": "digits"}, "model": {"kind": "mlp"}}
        return {"name": name, "config": config | ({"compression": compression} if compression else {})}

    records = [
        record("a", "fedavg"),
        record("b", "fedavg"),
        record("c", "fedavg", {"up": ["int8"]}),
        record("d", "scaffold"),
        record("e", "fedavg", {"up": ["int8"]}),
    ]
    assert [r["name"] for r in carry.sample(records)] == ["a", "c", "d"]

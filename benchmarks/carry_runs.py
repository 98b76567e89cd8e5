"""Carry stored event-ADMM-family runs across a change of simulation code that should not change them.

run_key.py keys every stored run by the simulation code, so any edit of src/taciturn that a run
executes (a refactor, a renamed helper) throws away hours of stored runs. This script keeps them
only where the new code is shown to make the same runs: it reruns a sample of an old log's runs
under the current code (the first run of each kind: method, [compression] table, dataset, model,
in log order, so the sample is fixed before anything is rerun) and compares every stored field
(per-round rows, trigger ratios, z changes, config) with the stored one, exactly. One difference
and it writes nothing. Otherwise every old run is appended to the new log under its key for the
current code, with ``"carried": {"from_key", "verified_by"}`` saying where it came from (and
``"before"``, the same, where it had been carried already); the
reruns themselves are appended as ordinary runs.

It reads logs made by event_admm.py's run_one (event_admm.py and frontier.py):

    python benchmarks/carry_runs.py OLD_LOG NEW_LOG --jobs 2
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import event_admm as ea
from rich.console import Console
from run_key import append_run, read_runs
from workers import one_run_per_core

console = Console()
UNCOMPARED = ("key", "wall_s", "carried")  # a run's time and its key differ from run to run of one config


def kind(record: dict[str, Any]) -> str:
    """What decides which code paths a run takes: its algorithm, compressors, data and model."""
    config = record["config"]
    return json.dumps(
        [config["algorithm"]["name"], config.get("compression"), config["data"], config["model"]],
        sort_keys=True,
    )


def sample(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first record of each kind, in log order."""
    first: dict[str, dict[str, Any]] = {}
    for record in records:
        first.setdefault(kind(record), record)
    return list(first.values())


def rerun(record: dict[str, Any], runs: Path) -> dict[str, Any]:
    """``record``'s run made again under the current code, keyed for it."""
    tree = {"name": record["name"], **record["config"]}
    calibration = bool(record["ratios"])  # only a calibration run kept its trigger ratios
    made = ea.train(
        tree, runs / record["name"], record["method"], record["knob"], record["seed"], calibration
    )
    return {"key": ea.key_of_tree(record["config"])} | made


def _rerun(args: tuple[dict[str, Any], Path]) -> dict[str, Any]:
    return rerun(*args)


def differences(stored: dict[str, Any], made: dict[str, Any]) -> list[str]:
    """The fields of ``stored`` that ``made`` does not reproduce exactly."""
    fields = sorted((set(stored) | set(made)) - set(UNCOMPARED))
    return [
        f
        for f in fields
        if json.dumps(stored.get(f), sort_keys=True) != json.dumps(made.get(f), sort_keys=True)
    ]


def carry(old_log: Path, new_log: Path, jobs: int, runs: Path) -> int | None:
    """Verify a sample of ``old_log`` under the current code, then append its runs to ``new_log``
    under their current keys: the number carried, or None where a sample run differs."""
    have = read_runs(new_log)
    keyed = ((r, ea.key_of_tree(r["config"])) for r in read_runs(old_log).values())
    todo = [(record, key) for record, key in keyed if key not in have]  # with its current key
    if not todo:
        console.print(f"every run of {old_log} is already in {new_log} under the current code")
        return 0
    checks = sample([record for record, _ in todo])
    console.print(
        f"{len(todo)} runs to carry; rerunning {len(checks)}, one of each kind, on {jobs} processes"
    )
    if jobs == 1:  # in this process (a test's patched paths hold)
        made = [rerun(r, runs) for r in checks]
    else:
        with one_run_per_core(jobs) as pool:
            made = list(pool.map(_rerun, [(r, runs) for r in checks]))
    failed = [(r["name"], fields) for r, m in zip(checks, made, strict=True) if (fields := differences(r, m))]
    for record in made:
        append_run(new_log, record)  # a rerun is a run of the current code either way
    if failed:
        for name, fields in failed:
            console.print(f"[red]{name}: the current code changes {', '.join(fields)}[/red]")
        console.print("[red]nothing carried: the code change changes these runs; they are made again[/red]")
        return None
    names = [r["name"] for r in checks]
    carried = 0
    for record, key in todo:
        if record["name"] in names:
            continue  # its rerun is stored already
        origin = {"from_key": record["key"], "verified_by": names}
        if "carried" in record:  # carried before: keep the whole chain back to the run that was made
            origin["before"] = record["carried"]
        append_run(new_log, record | {"key": key, "carried": origin})
        carried += 1
    console.print(
        f"{carried} runs carried to {new_log}, verified by {len(names)} reruns that matched exactly"
    )
    return carried


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old_log", type=Path, help="a runs log made under earlier simulation code")
    parser.add_argument("new_log", type=Path, help="the log to append the carried runs to")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes for the reruns")
    args = parser.parse_args(argv)
    return 1 if carry(args.old_log, args.new_log, args.jobs, ea.RUNS.parent / "carry") is None else 0


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks/run_key.py: a stored benchmark run is keyed by the code simulation runs execute."""

from __future__ import annotations

from benchmark_module import load_benchmark


def test_the_code_version_covers_the_simulation_path_and_not_the_bandits_or_the_cli():
    modules = load_benchmark("run_key").simulation_modules()
    simulation = ("algorithms.ferret", "algorithms.fedkseed", "algorithms.event_admm", "engine.executor")
    for needed in (*simulation, "experiments.runner", "experiments.language"):
        assert f"taciturn.{needed}" in modules
    elsewhere = ("taciturn.bandits", "taciturn.rl", "taciturn.cli", "taciturn.deploy")
    assert not [name for name in modules if name.startswith(elsewhere)]


def test_the_code_version_changes_with_one_byte_of_one_module(tmp_path):
    run_key = load_benchmark("run_key")
    modules = {name: tmp_path / f"{name}.py" for name in ("taciturn.a", "taciturn.b")}
    for path in modules.values():
        path.write_text("x = 1\n")
    before = run_key.code_version(modules)
    modules["taciturn.b"].write_text("x = 2\n")
    assert run_key.code_version(modules) != before
    # the module's name is hashed with its source: moving code to another module is a change too
    renamed = {"taciturn.c": modules["taciturn.a"], "taciturn.b": modules["taciturn.b"]}
    assert run_key.code_version(renamed) != run_key.code_version(modules)

"""Mutation testing with mutmut 3 (https://mutmut.readthedocs.io), package by package.

    make mutation                                             # every target below
    python tools/mutation.py rl/ core/codec.py                # a package, a module
    python tools/mutation.py rl/ --work /tmp/mut --recheck    # resume; re-test the survivors

mutmut reads its settings from pyproject.toml in the working directory and writes ``mutants/``
there, so each target runs in a scratch copy of the project (src/, tests/ and a pyproject.toml
whose [tool.mutmut] names the modules and the test files that check them): one target's run never
touches the checkout or another target's. A package is one mutmut project (its tests' coverage is
collected once), reported module by module. Each module names only the tests written for it,
which keeps a run short; a mutant those tests miss is a survivor even if a slow integration test
elsewhere would catch it. With ``--work`` the scratch copy stays: a run cut short resumes where
it stopped, and ``--recheck`` re-tests the survivors after tests were added.

Score = killed / (killed + survived + no tests), timeouts counted as killed (an infinite loop is
caught); mutants left "not checked" (a run cut short) are reported, not scored. Every survivor is
printed with its diff; docs/mutation.md lists them with the reason each is equivalent or harmless,
and the scores with the command that produced them. Not part of ``make test``: it is CPU-heavy
(every mutant reruns its tests), minutes per module on an idle core.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# module under src/taciturn -> the tests that check it (files, or pytest ids for one slow file's test)
TARGETS: dict[str, list[str]] = {
    "core/codec.py": ["tests/test_codec.py"],
    "engine/validation.py": ["tests/test_server_checks.py"],
    "rl/analysis.py": ["tests/test_rl_analysis.py"],
    "rl/bonuses.py": ["tests/test_fedq.py"],
    "rl/step_sizes.py": ["tests/test_fedq.py", "tests/test_rl_mdp.py"],
    "rl/mdp.py": ["tests/test_rl_mdp.py", "tests/test_fedq.py"],
    "rl/agents.py": ["tests/test_fedq.py"],
    "rl/fedq.py": ["tests/test_fedq.py"],
    "rl/federation.py": ["tests/test_fedq.py"],
    "rl/ucb.py": ["tests/test_fedq.py", "tests/test_rl_mdp.py"],
    "bandits/rules/base.py": ["tests/test_bandits_rules.py"],
    "bandits/rules/fixed.py": ["tests/test_bandits_rules.py"],
    "bandits/rules/clusters.py": ["tests/test_bandits_rules.py"],
    "bandits/rules/club.py": ["tests/test_bandits_rules.py"],
    "bandits/rules/sclub.py": ["tests/test_bandits_rules.py"],
    "bandits/rules/dynucb.py": ["tests/test_bandits_rules.py"],
    "bandits/rules/bass.py": ["tests/test_bandits_rules.py", "tests/test_bandits_separation.py"],
    "bandits/separation.py": ["tests/test_bandits_separation.py"],
    "algorithms/base.py": ["tests/test_fedavg.py", "tests/test_baselines.py", "tests/test_config_strict.py"],
    "algorithms/replay.py": ["tests/test_ferret.py", "tests/test_fedkseed.py"],
    "algorithms/fedavg.py": [
        "tests/test_fedavg.py",
        "tests/test_buffers.py::test_local_buffers_stay_with_each_client_and_the_server_keeps_its_own[sequential]",
    ],
    "algorithms/fedprox.py": ["tests/test_baselines.py"],
    "algorithms/scaffold.py": ["tests/test_baselines.py", "tests/test_acceptance.py"],
    "algorithms/fedadmm.py": ["tests/test_baselines.py", "tests/test_acceptance.py"],
    "algorithms/event_admm.py": ["tests/test_event_admm.py", "tests/test_acceptance.py"],
    "algorithms/shared_bases.py": ["tests/test_ferret.py"],
    "algorithms/ferret.py": ["tests/test_ferret.py"],
    "algorithms/fedkseed.py": ["tests/test_fedkseed.py"],
}
STATUS = re.compile(r"^\s*(\S+): (.+)$")
KILLED = ("killed", "timeout")  # a timeout is an infinite loop caught
COUNTED = (*KILLED, "survived", "no tests")


def modules_of(target: str) -> list[str]:
    """A module of TARGETS, or every module of TARGETS under a package ("rl/")."""
    if target in TARGETS:
        return [target]
    return [m for m in TARGETS if target.endswith("/") and m.startswith(target)]


def prepare(work: Path, modules: list[str]) -> None:
    """Lay out (or refresh) the scratch project: the current src/ and tests/, and its pyproject.toml."""
    for part in ("src", "tests"):
        shutil.rmtree(work / part, ignore_errors=True)
        shutil.copytree(ROOT / part, work / part, ignore=shutil.ignore_patterns("__pycache__"))
    tests = sorted({t for m in modules for t in TARGETS[m]})
    (work / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"only_mutate = {json.dumps([f'src/taciturn/{m}' for m in modules])}\n"  # a JSON list is TOML
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider"]\n'
    )


def run_target(modules: list[str], children: int, work: Path, recheck: bool) -> dict[str, str]:
    """Run mutmut on ``modules`` in one scratch project ``work``: mutant name -> status. Mutants
    already decided there keep their verdict (a cut-short run resumes); ``recheck`` re-tests the
    survivors against today's tests first."""
    work.mkdir(parents=True, exist_ok=True)
    prepare(work, modules)
    env = {**os.environ, "PYTHONPATH": str(work / "src"), "TACITURN_OFFLINE": "1"}
    mutmut = [sys.executable, "-m", "mutmut"]

    def output(*args: str) -> str:
        return subprocess.run(
            [*mutmut, *args], cwd=work, env=env, check=True, capture_output=True, text=True
        ).stdout

    def statuses() -> dict[str, str]:
        lines = output("results", "--all", "true").splitlines()
        return {m.group(1): m.group(2) for line in lines if (m := STATUS.match(line))}

    run = [*mutmut, "run", "--max-children", str(children)]
    if recheck and (work / "mutants").exists():
        survivors = [name for name, status in statuses().items() if status in ("survived", "no tests")]
        if survivors:
            subprocess.run([*run, *survivors], cwd=work, env=env, check=True)
    subprocess.run(run, cwd=work, env=env, check=True)
    status_of = statuses()
    for name in sorted(n for n, status in status_of.items() if status not in KILLED):
        print(output("show", name))
    return status_of


def module_of(mutant: str, modules: list[str]) -> str:
    """The module a mutant name (``taciturn.rl.fedq.x_aggregate__mutmut_3``) belongs to."""
    for module in modules:
        key = "taciturn." + module.removesuffix(".py").replace("/", ".") + "."
        if mutant.startswith(key) or "." + key in mutant:
            return module
    raise ValueError(f"mutant {mutant} is in none of {modules}")


def row(name: str, statuses: list[str]) -> str:
    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
    killed = sum(counts.get(s, 0) for s in KILLED)
    counted = sum(counts.get(s, 0) for s in COUNTED)
    score = f"{100 * killed / counted:.1f}%" if counted else "-"
    return f"| {name} | {killed} | {counted} | {score} | {counts} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "targets",
        nargs="*",
        help="modules under src/taciturn, or packages ending in / (rl/): one mutmut project each "
        "(default: every module of TARGETS, package by package)",
    )
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once")
    parser.add_argument(
        "--work",
        type=Path,
        help="keep each target's scratch project in WORK/<target> (default: a temporary folder): "
        "a run cut short resumes there, and the verdicts can be read again",
    )
    parser.add_argument(
        "--recheck", action="store_true", help="with --work: re-test the survivors against today's tests"
    )
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if not modules_of(t)]
    if unknown:
        parser.error(f"no tests are mapped for {unknown}; known targets: {', '.join(TARGETS)}")
    if args.recheck and args.work is None:
        parser.error("--recheck needs --work (the folder that holds the earlier verdicts)")
    targets = args.targets or list(dict.fromkeys(m.rsplit("/", 1)[0] + "/" for m in TARGETS))
    lines = ["", "| module | killed | mutants | score | by status |", "|---|---:|---:|---:|---|"]
    for target in targets:
        modules = modules_of(target)
        with tempfile.TemporaryDirectory(prefix="taciturn-mutation-") as scratch:
            work = args.work / target.strip("/").replace("/", "-") if args.work else Path(scratch)
            status_of = run_target(modules, args.children, work, args.recheck)
        by_module: dict[str, list[str]] = {m: [] for m in modules}
        for mutant, status in status_of.items():
            by_module[module_of(mutant, modules)].append(status)
        lines += [row(m, by_module[m]) for m in modules]
        if len(modules) > 1:
            lines.append(row(f"**{target}**", list(status_of.values())))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

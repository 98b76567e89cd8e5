"""Mutation testing with mutmut 3 (https://mutmut.readthedocs.io), one target module at a time.

    make mutation                                           # every target below
    python tools/mutation.py core/codec.py rl/bonuses.py    # some of them

mutmut reads its settings from pyproject.toml in the working directory and writes ``mutants/``
there, so each target runs in a scratch copy of the project (src/, tests/ and a pyproject.toml
whose [tool.mutmut] names the target and the test files that check it): one target's run never
touches the checkout or another target's. Each target names only the tests written for it, which
keeps a run short; a mutant those tests miss is a survivor even if a slow integration test
elsewhere would catch it.

Score = killed / (killed + survived + no tests), timeouts counted as killed (an infinite loop is
caught); mutants left "not checked" (a run cut short) are reported, not scored. Every survivor is
printed with its diff; docs/mutation.md lists them with the reason each is equivalent or harmless,
and the scores with the command that produced them. Not part of ``make test``: it is CPU-heavy
(every mutant reruns its tests), minutes per module on an idle core.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "taciturn"

TARGETS: dict[str, list[str]] = {  # module under src/taciturn -> the test files that check it
    "core/codec.py": ["tests/test_codec.py"],
    "engine/validation.py": ["tests/test_server_checks.py", "tests/test_acceptance.py"],
    "rl/bonuses.py": ["tests/test_fedq.py"],
    "rl/step_sizes.py": ["tests/test_fedq.py", "tests/test_rl_mdp.py"],
    "rl/fedq.py": ["tests/test_fedq.py"],
    "rl/agents.py": ["tests/test_fedq.py"],
    "rl/ucb.py": ["tests/test_fedq.py", "tests/test_rl_mdp.py"],
    "bandits/rules/club.py": ["tests/test_bandits_rules.py"],
    "bandits/rules/sclub.py": ["tests/test_bandits_rules.py"],
    "bandits/rules/dynucb.py": ["tests/test_bandits_rules.py"],
    "bandits/rules/bass.py": ["tests/test_bandits_rules.py", "tests/test_bandits_separation.py"],
    "bandits/separation.py": ["tests/test_bandits_separation.py"],
    "algorithms/scaffold.py": ["tests/test_baselines.py", "tests/test_acceptance.py"],
    "algorithms/fedprox.py": ["tests/test_baselines.py"],
    "algorithms/fedavg.py": ["tests/test_fedavg.py"],
    "algorithms/event_admm.py": ["tests/test_event_admm.py", "tests/test_acceptance.py"],
    "algorithms/fedadmm.py": ["tests/test_baselines.py"],
    "algorithms/ferret.py": ["tests/test_ferret.py"],
    "algorithms/fedkseed.py": ["tests/test_fedkseed.py"],
}
STATUS = re.compile(r"^\s*(\S+): (.+)$")


def run_target(module: str, tests: list[str], children: int) -> dict[str, list[str]]:
    with tempfile.TemporaryDirectory(prefix="taciturn-mutation-") as scratch:
        work = Path(scratch)
        shutil.copytree(ROOT / "src", work / "src")
        shutil.copytree(ROOT / "tests", work / "tests")
        selection = ", ".join(f'"{t}"' for t in tests)
        (work / "pyproject.toml").write_text(
            "[tool.mutmut]\n"
            'source_paths = ["src"]\n'
            f'only_mutate = ["src/taciturn/{module}"]\n'
            f"pytest_add_cli_args_test_selection = [{selection}]\n"
            'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider"]\n'
        )
        env = {**os.environ, "PYTHONPATH": str(work / "src"), "TACITURN_OFFLINE": "1"}
        mutmut = [sys.executable, "-m", "mutmut"]
        subprocess.run([*mutmut, "run", "--max-children", str(children)], cwd=work, env=env, check=True)

        def output(*args: str) -> str:
            return subprocess.run(
                [*mutmut, *args], cwd=work, env=env, check=True, capture_output=True, text=True
            ).stdout

        listing = output("results", "--all", "true")
        by_status: dict[str, list[str]] = {}
        for line in listing.splitlines():
            if match := STATUS.match(line):
                by_status.setdefault(match.group(2), []).append(match.group(1))
        missed = [n for s, names in by_status.items() if s not in ("killed", "timeout") for n in names]
        for name in sorted(missed):
            print(output("show", name))
        return by_status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("targets", nargs="*", help="modules under src/taciturn (default: all of TARGETS)")
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once")
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        parser.error(f"no tests are mapped for {unknown}; known targets: {', '.join(TARGETS)}")
    rows = []
    for module in args.targets or list(TARGETS):
        by_status = run_target(module, TARGETS[module], args.children)
        killed = len(by_status.get("killed", [])) + len(by_status.get("timeout", []))
        counted = killed + len(by_status.get("survived", [])) + len(by_status.get("no tests", []))
        rows.append((module, killed, counted, {s: len(n) for s, n in by_status.items()}))
    print("\n| module | killed | mutants | score | by status |\n|---|---:|---:|---:|---|")
    for module, killed, counted, statuses in rows:
        score = f"{100 * killed / counted:.1f}%" if counted else "-"
        print(f"| {module} | {killed} | {counted} | {score} | {statuses} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

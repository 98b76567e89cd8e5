"""`taciturn deploy node`: the SuperNode kept up (deploy/node.py) and its long-lived ClientApp
(deploy/worker.py), without a SuperLink: the restart policy with a stand-in SuperNode, and the
refusal of any ClientApp but taciturn's."""

import argparse
import sys
import threading

import pytest

pytest.importorskip("flwr")

from taciturn.deploy import node
from taciturn.deploy.settings import DeployError
from taciturn.deploy.worker import APPS, clientapp_of


def stand_in(tmp_path, codes: list[int]) -> list[str]:
    """A 'SuperNode' that exits as Flower's flwr_exit does with codes[k] on its k-th start (it
    prints "Exit Code: N" and ends with status 1 for an error, 0 for a graceful exit), then runs
    until stopped."""
    script = tmp_path / "supernode.py"
    script.write_text(
        "import pathlib, sys, time\n"
        f"log = pathlib.Path({str(tmp_path / 'starts')!r})\n"
        "k = len(log.read_text().split()) if log.exists() else 0\n"
        "log.write_text(log.read_text() + ' start' if log.exists() else 'start')\n"
        f"codes = {codes!r}\n"
        "if k < len(codes):\n"
        "    print(f'Exit Code: {codes[k]}', flush=True)\n"
        "    sys.exit(0 if codes[k] < 100 else 1)\n"
        "time.sleep(60)\n"
    )
    return [sys.executable, str(script)]


def starts(tmp_path) -> int:
    log = tmp_path / "starts"
    return len(log.read_text().split()) if log.exists() else 0


def test_a_refused_supernode_is_started_again_until_it_stays_up(tmp_path):
    """Refused twice (Flower's 305, as inside the ~45 s after a kill -9) and once stopped by the
    SuperLink forgetting it (1): started again each time, and it stays up the fourth time."""
    stop, outcome = threading.Event(), {}
    keeper = threading.Thread(
        target=node._keep_up, args=(stand_in(tmp_path, [305, 305, 1]), 0.05, stop, outcome)
    )
    keeper.start()
    try:
        deadline = 30.0
        while starts(tmp_path) < 4 and deadline > 0:
            stop.wait(0.1)
            deadline -= 0.1
        assert starts(tmp_path) == 4 and keeper.is_alive()
    finally:
        stop.set()
        keeper.join(20)
    assert not keeper.is_alive() and outcome == {}


def test_a_supernode_that_cannot_work_ends_the_command_with_its_code(tmp_path):
    stop, outcome = threading.Event(), {}
    node._keep_up(stand_in(tmp_path, [302]), 0.05, stop, outcome)  # an invalid node key
    assert outcome == {"code": 302} and stop.is_set() and starts(tmp_path) == 1


def test_the_supernode_runs_with_process_isolation_and_the_flags_given():
    parser = argparse.ArgumentParser()
    node.add_arguments(parser)
    args = parser.parse_args(
        ["--superlink", "10.77.0.1:9093", "--root-certificates", "ca.crt", "--port", "9101",
         "--node-config", 'clients="0"', "--", "--max-retries", "5"]
    )  # fmt: skip
    command = node.supernode_command(args)
    assert command[1:] == [
        "--isolation", "process", "--port", "9101", "--superlink", "10.77.0.1:9093",
        "--root-certificates", "ca.crt", "--node-config", 'clients="0"', "--max-retries", "5",
    ]  # fmt: skip


def fab_naming(tmp_path, clientapp: str):
    """The FAB `flwr run` would build from an app folder naming ``clientapp``."""
    from flwr.cli.build import build_fab_from_disk
    from flwr.supercore.fab import Fab

    from taciturn.deploy.app_folder import write_app
    from tests.conftest import tiny_config

    pyproject = write_app(tmp_path / "app", tiny_config(), tmp_path / "run", overwrite=True)
    text = pyproject.read_text().replace('"taciturn.deploy.client_app:app"', f'"{clientapp}"')
    pyproject.write_text(text)
    return Fab("", build_fab_from_disk(tmp_path / "app"), {})


def test_the_long_lived_clientapp_runs_taciturns_clientapp_only(tmp_path):
    assert (
        clientapp_of(fab_naming(tmp_path, "taciturn.deploy.client_app:app"))
        is APPS["taciturn.deploy.client_app:app"]
    )
    with pytest.raises(DeployError, match=r"runs taciturn's ClientApp only.*'os:system'"):
        clientapp_of(fab_naming(tmp_path, "os:system"))

"""``taciturn deploy node``: a SuperNode that serves its clients from one long-lived process and
comes back by itself.

It starts Flower's ``flower-supernode`` with ``--isolation process`` and the flags given, and serves
the node's ClientApp tasks itself (worker.py): the node's data and the run's model stay in memory
between rounds instead of a new process per message.

A SuperNode exits when the SuperLink refuses it: after a ``kill -9`` of a node, the SuperLink holds
it online until two heartbeats are missed (about 45 s; Flower's ``--max-retries`` and
``--max-wait-time`` cover lost connections, not a refusal), and a SuperLink restarted without its
``--database`` forgets the node. This command starts it again after ``--retry-s`` seconds (doubling
up to ``MAX_RETRY_S``) until it is stopped (Ctrl-C, SIGTERM), so the node rejoins on its own once
the SuperLink admits it; with ``--database`` a restarted SuperLink still knows the node's key, so no
site registers again. A SuperNode that exits for a reason retrying cannot fix (a bad key, bad TLS
files, a wrong address: Flower's exit codes in ``GIVE_UP``) ends this command with that code.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from taciturn.deploy import worker

log = logging.getLogger(__name__)

MAX_RETRY_S = 60.0
EXIT_CODE = re.compile(r"Exit Code: (\d+)")
# flwr/supercore/exit/exit_code.py: the node's own configuration is wrong; retrying cannot help
GIVE_UP = {
    302: "invalid node key",
    303: "node auth without TLS",
    304: "invalid trusted entities",
    600: "invalid SuperLink address",
    602: "TLS not supported",
    603: "bad root certificates",
    604: "a path is invalid",
    605: "bad TLS certificates",
    606: "incompatible Flower versions",
}


def supernode_command(args: argparse.Namespace) -> list[str]:
    flower = Path(sys.executable).with_name("flower-supernode")
    command = [str(flower) if flower.exists() else "flower-supernode", "--isolation", "process"]
    command += ["--port", str(args.port), "--superlink", args.superlink]
    if args.root_certificates:
        command += ["--root-certificates", args.root_certificates]
    if args.auth_supernode_private_key:
        command += ["--auth-supernode-private-key", args.auth_supernode_private_key]
    if args.node_config:
        command += ["--node-config", args.node_config]
    extra = list(args.flower_args or [])
    return command + (extra[1:] if extra[:1] == ["--"] else extra)


def run_node(args: argparse.Namespace) -> int:
    """Keep a SuperNode up and serve its tasks until SIGINT/SIGTERM; the exit code."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    outcome: dict[str, int] = {}
    keeper = threading.Thread(target=_keep_up, args=(supernode_command(args), args.retry_s, stop, outcome))
    keeper.start()
    try:
        worker.serve(f"127.0.0.1:{args.port}", stop)
    finally:
        stop.set()
        keeper.join()
    return outcome.get("code", 0)


def _keep_up(command: list[str], retry_s: float, stop: threading.Event, outcome: dict[str, int]) -> None:
    wait = retry_s
    while not stop.is_set():
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        said: dict[str, int] = {}
        echo = threading.Thread(target=_echo, args=(proc, said), daemon=True)
        echo.start()
        while proc.poll() is None and not stop.is_set():
            stop.wait(0.2)
        if stop.is_set():
            _end(proc)
            echo.join(5)
            return
        echo.join(5)
        code = said.get("code", proc.returncode)  # Flower's own code; the process status is 0 or 1
        if code in GIVE_UP:
            log.error("the SuperNode exited with code %d (%s): fix it and start again", code, GIVE_UP[code])
            outcome["code"] = code
            stop.set()
            return
        if time.monotonic() - started > 5 * MAX_RETRY_S:  # it ran a good while: start over gently
            wait = retry_s
        print(
            f"taciturn deploy node: the SuperNode exited (code {code}); starting it again in {wait:g} s",
            file=sys.stderr,
            flush=True,
        )
        stop.wait(wait)
        wait = min(2 * wait, MAX_RETRY_S)


def _echo(proc: subprocess.Popen, said: dict[str, int]) -> None:
    """The SuperNode's output, passed on as it comes; the exit code it prints (``flwr_exit``:
    "Exit Code: 305") kept in ``said``, since its process status only tells success from error."""
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if (found := EXIT_CODE.search(line)) is not None:
            said["code"] = int(found[1])


def _end(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)  # it tells the SuperLink it leaves
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--superlink", required=True, help="the SuperLink's Fleet API, HOST:PORT")
    parser.add_argument("--root-certificates", help="the CA certificate that signed the SuperLink's (ca.crt)")
    parser.add_argument("--auth-supernode-private-key", help="this node's private key (node-<i>)")
    parser.add_argument(
        "--node-config", help='\'clients="0,1" state-dir="..." data.path="..."\' (docs/deploy.md)'
    )
    parser.add_argument("--port", type=int, default=9094, help="the SuperNode's local runtime API port")
    parser.add_argument(
        "--retry-s", type=float, default=10.0, help="seconds before starting a SuperNode that exited again"
    )
    parser.add_argument(
        "flower_args", nargs=argparse.REMAINDER, help="after --: more flower-supernode options, as they are"
    )

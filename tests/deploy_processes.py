"""Real Flower processes on loopback for the end-to-end test: a SuperLink, SuperNodes, `flwr run`.

Every port is a free one the kernel gave us; every process is started here, remembered by its id,
and ended in ``close`` (SIGTERM, then SIGKILL). Flower starts helpers in their own sessions
(SuperExec, flwr-serverapp, flwr-clientapp); they are found by the unique ports in their command
lines and ended by id too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import taciturn

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    def __init__(self, root: Path):
        self.root = root
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, tuple[subprocess.Popen, int]] = {}  # name -> (process, runtime port)
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(Path(taciturn.__file__).parents[1]),
            "FLWR_HOME": str(root / "flwr-home"),
            "TACITURN_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "FLWR_TELEMETRY_ENABLED": "0",  # nothing leaves loopback
        }

    def start(self, name: str, runtime_port: int, *args: str) -> subprocess.Popen:
        """Start ``args``; ``runtime_port`` is the port its helpers reach it on (--port)."""
        with (self.logs / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(
                [str(BIN / args[0]), *args[1:]],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = (proc, runtime_port)
        return proc

    def run(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / args[0]), *args[1:]], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def wait_for_port(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"nothing listens on port {port} after {timeout} s")

    def stop(self, name: str) -> None:
        proc, port = self.procs.pop(name)
        _end(proc.pid, proc)
        _end_helpers(port)

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def _end_helpers(port: int) -> None:
    """Flower's detached helpers of the process serving ``port`` (its SuperExec and the
    flwr-serverapp / flwr-clientapp processes that SuperExec launched): each names that port as
    its --runtime-api-address."""
    mark = b"\x00".join([b"--runtime-api-address", f"127.0.0.1:{port}".encode(), b""])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if mark in cmdline:
                _end(int(entry.name), None)


def _end(pid: int, proc: subprocess.Popen | None) -> None:
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if proc is not None:
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.05)

"""Real Flower processes on loopback for the end-to-end test and benchmarks/deploy.py: a SuperLink,
SuperNodes, `flwr run`.

Every port is a free one the kernel gave us; every process is started here, remembered by its id,
and ended in ``close`` (SIGTERM, then SIGKILL). Flower starts helpers in their own sessions
(SuperExec, flwr-serverapp, flwr-clientapp); they are found by the unique ports in their command
lines and ended by id too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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

    def start(
        self, name: str, runtime_port: int, *args: str, netns: str | None = None, cwd=None, env=None
    ) -> subprocess.Popen:
        """Start ``args`` (in network namespace ``netns``, folder ``cwd``, with ``env`` added);
        ``runtime_port`` is the port its helpers reach it on (--port)."""
        starts = len(list(self.logs.glob(f"{name}.*log")))
        with (self.logs / f"{name}.{starts}.log").open("w") as log:
            proc = subprocess.Popen(
                self._command(args, netns),
                env={**self.env, **(env or {})},
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = (proc, runtime_port)
        return proc

    def run(
        self, *args: str, timeout: float, netns: str | None = None, cwd=None, env=None
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self._command(args, netns),
            env={**self.env, **(env or {})},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    @staticmethod
    def _command(args, netns: str | None) -> list[str]:
        command = [str(BIN / args[0]), *args[1:]]
        return command if netns is None else ["ip", "netns", "exec", netns, *command]  # ip execs it: same pid

    def log(self, name: str) -> str:
        """Everything ``name`` wrote, over all its starts."""
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.glob(f"{name}.*log")))

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


def wait_for(predicate, timeout: float, what: str):
    """``predicate()``'s first true value, polled every 0.1 s for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise TimeoutError(what)


class Federation:
    """A SuperLink with TLS, SuperNode authentication and a database, and registered SuperNodes,
    on loopback, started as docs/deploy.md starts them.

    ``hosts[i]`` is the client ids node ``i + 1`` hosts ("0,1"); node ``i + 1`` authenticates with
    key ``node-<i+1>``, keeps its state in ``state-<i+1>`` and adds ``node_data[i]`` to its node
    config (its own data: 'data.path="..."'). Nodes run as `taciturn deploy node` (a long-lived
    ClientApp, restarted when the SuperNode exits), or as a plain `flower-supernode` (``plain``).
    Key ``node-<len(hosts)+1>`` is made but never registered (``strangers`` starts a node with it,
    and one without the CA)."""

    def __init__(
        self,
        root: Path,
        processes: Processes,
        hosts: list[str],
        boot_s: float,
        node_data: list[str] | None = None,
        plain: bool = False,
    ):
        from taciturn.deploy.certs import make_credentials

        self.root, self.processes, self.hosts, self.boot_s = root, processes, hosts, boot_s
        self.node_data, self.plain = node_data or [""] * len(hosts), plain
        self.creds = make_credentials(root / "creds", nodes=len(hosts) + 1)
        self.link = free_port()
        home = root / "flwr-home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "local"\n\n[superlink.local]\n'
            f'address = "127.0.0.1:{self.link}"\nroot-certificates = "{self.creds["ca.crt"]}"\n'
        )
        self.start_link()
        for key in range(1, len(hosts) + 1):
            pub = str(self.creds[f"node-{key}.pub"])
            done = processes.run("flwr", "supernode", "register", pub, "local", timeout=boot_s)
            if done.returncode != 0:
                raise RuntimeError(f"flwr supernode register failed: {done.stdout}{done.stderr}")
        for key in range(1, len(hosts) + 1):
            self.node(f"node-{key}", key, *self.with_ca)

    def start_link(self) -> None:
        """The SuperLink, persistent (``--database``): a restart keeps the registered nodes."""
        self.processes.start(
            "superlink", self.link, "flower-superlink",
            "--ssl-ca-certfile", str(self.creds["ca.crt"]),
            "--ssl-certfile", str(self.creds["server.crt"]),
            "--ssl-keyfile", str(self.creds["server.key"]),
            "--enable-supernode-auth",
            "--disable-runtime-dependency-installation",
            "--database", str(self.root / "superlink.db"),
            "--host", "127.0.0.1", "--port", str(self.link),
        )  # fmt: skip
        self.processes.wait_for_port(self.link, self.boot_s)

    def connected(self) -> int:
        """How many registered nodes the SuperLink sees online now (`flwr supernode ls`)."""
        done = self.processes.run("flwr", "supernode", "ls", "local", "--format", "json", timeout=self.boot_s)
        nodes = json.loads(done.stdout).get("nodes", []) if done.returncode == 0 else []
        return sum(1 for node in nodes if node.get("status") == "online")

    @property
    def with_ca(self) -> tuple[str, ...]:
        return ("--root-certificates", str(self.creds["ca.crt"]))

    def state_dir(self, key: int) -> Path:
        return self.root / f"state-{key}"

    def node(
        self, name: str, key: int, *flags: str, clients: str | None = None, plain: bool | None = None
    ) -> None:
        """Start a SuperNode ``name`` with key ``node-<key>``, hosting ``hosts[key - 1]``."""
        port = free_port()
        clients = self.hosts[key - 1] if clients is None else clients
        data = self.node_data[key - 1] if key <= len(self.node_data) else ""
        config = f'clients="{clients}" state-dir="{self.state_dir(key)}" {data}'.strip()
        common = (
            "--superlink", f"127.0.0.1:{self.link}", "--port", str(port),
            "--auth-supernode-private-key", str(self.creds[f"node-{key}"]), "--node-config", config,
        )  # fmt: skip
        if self.plain if plain is None else plain:
            self.processes.start(name, port, "flower-supernode", *flags, *common)
        else:  # flags are the CA's: --root-certificates ca.crt
            self.processes.start(name, port, "taciturn", "deploy", "node", *flags, *common, "--retry-s", "2")

    def strangers(self) -> None:
        """A node whose key was never registered, and one with a registered key but no CA."""
        give_up = ("--max-retries", "2", "--max-wait-time", "30")
        self.node("stranger", len(self.hosts) + 1, *self.with_ca, *give_up, clients=self.hosts[0], plain=True)
        self.node("no-ca", 1, *give_up, plain=True)

    def refused(self, name: str, reason: str) -> bool:
        """Whether node ``name`` gave up with ``reason`` in its log."""
        proc, _ = self.processes.procs[name]
        wait_for(lambda: proc.poll() is not None, self.boot_s, f"{name} kept running")
        return proc.returncode != 0 and reason in self.log(name)

    def log(self, name: str) -> str:
        return self.processes.log(name)

    def submit(self, config, round_timeout: float, min_nodes: int | None = None, **app):
        """Start ``config`` with `flwr run --stream` (its output: ``self.log(f"stream-{name}")``);
        the server waits for ``min_nodes`` nodes (all by default) at the start of each round. The
        run directory it writes; ``app``: more settings of the app folder (min_trained, ...)."""
        from taciturn.deploy.app_folder import write_app
        from taciturn.report.rundir import RunDir

        folder, out = self.root / f"app-{config.name}", self.root / f"deployed-{config.name}"
        nodes = min_nodes or len(self.hosts)
        write_app(folder, config, out, round_timeout=round_timeout, min_nodes=nodes, overwrite=True, **app)
        self.processes.start(f"stream-{config.name}", 0, "flwr", "run", str(folder), "local", "--stream")
        return RunDir(out)

    def streamed(self, name: str, timeout: float) -> str:
        """The whole output of `flwr run --stream` for run ``name``, once it has ended."""
        proc, _ = self.processes.procs[f"stream-{name}"]
        wait_for(lambda: proc.poll() is not None, timeout, f"flwr run --stream of {name} did not end")
        return self.log(f"stream-{name}")

    def status(self, name: str) -> str:
        """The Flower status of run ``name`` (`flwr ls --run-id`), e.g. 'finished:completed'."""
        started = re.search(r"Successfully started run (\d+)", self.log(f"stream-{name}"))
        if started is None:
            return ""
        done = self.processes.run(
            "flwr", "ls", "local", "--run-id", started[1], "--format", "json", timeout=self.boot_s
        )
        runs = json.loads(done.stdout).get("runs", [])
        return runs[0]["status"] if runs else ""

    def kill_and_restart(self, key: int, round: int, submit) -> tuple[Any, Path, dict[str, bytes]]:
        """``submit()`` a run; when node ``key`` receives its request of ``round``, stop it
        (SIGTERM: it leaves the SuperLink as a stopped machine does, and its helpers go too) and
        start it again at once with the same key and state folder. The run directory, the node's
        state folder of that run, and the files it held when it was stopped."""
        name = f"node-{key}"
        mark = f"ROUND {round}]"  # the SuperNode logs each message's group id: the round
        seen = self.log(name).count(mark)
        folder = self.state_dir(key)
        earlier = set(folder.iterdir()) if folder.exists() else set()
        rundir = submit()
        wait_for(
            lambda: self.log(name).count(mark) > seen, self.boot_s * 3, f"{name} never got round {round}"
        )
        self.processes.stop(name)
        (run_folder,) = set(folder.iterdir()) - earlier
        held = {p.name: p.read_bytes() for p in run_folder.iterdir()}
        self.node(name, key, *self.with_ca)
        return rundir, run_folder, held

    def finish(self, rundir, timeout: float):
        wait_for(lambda: (rundir.path / "report.html").exists(), timeout, f"{rundir.path} did not finish")
        return rundir

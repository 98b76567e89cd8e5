"""docs/deploy.md's walkthrough, run the way the doc runs it: a server and two nodes on different
machines, here two network namespaces joined by a veth pair (the server 10.77.0.1, the nodes'
machine 10.77.0.2), each side with its own files and Flower home.

The server's folder holds the credentials and the SuperLink's database, and no data; each node's
folder holds the CA certificate, its key and its own client's data file. The operator submits the
run from the nodes' machine, with an ``--out`` path relative to nothing there: the run directory
appears on the server. The certificate is made for ``--host 10.77.0.1`` only, so the run works only
because it also covers 127.0.0.1, where the SuperLink's own ServerApp connects. Skipped, with the
reason, where network namespaces cannot be made (not root, no ``ip``)."""

import os
import shutil
import subprocess

import numpy as np
import pytest

pytest.importorskip("flwr")

from taciturn.experiments.runner import start
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config
from tests.deploy_processes import Processes, free_port, wait_for
from tests.test_deploy import rows
from tests.test_deploy_e2e import close_enough

SERVER_IP, NODES_IP = "10.77.0.1", "10.77.0.2"
BOOT_S, RUN_S = 180, 300


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def machines():
    """Two network namespaces joined by a veth pair: (server's, nodes')."""
    tag = os.getpid() % 100000
    server, nodes = f"tac-srv-{tag}", f"tac-nod-{tag}"
    made = []
    try:
        if shutil.which("ip") is None:
            raise OSError("the ip command is missing")
        for ns in (server, nodes):
            ip("netns", "add", ns)
            made.append(ns)
        ip("link", "add", f"ts{tag}", "type", "veth", "peer", "name", f"tn{tag}")
        ip("link", "set", f"ts{tag}", "netns", server)
        ip("link", "set", f"tn{tag}", "netns", nodes)
        for ns, dev, address in ((server, f"ts{tag}", SERVER_IP), (nodes, f"tn{tag}", NODES_IP)):
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
    except (OSError, subprocess.SubprocessError) as error:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        detail = getattr(error, "stderr", "") or error
        pytest.skip(f"network namespaces cannot be made here (needs root and iproute2): {detail}")
    try:
        yield server, nodes
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def flwr_home(folder, port: int, ca) -> dict[str, str]:
    """A Flower home whose default connection is the SuperLink at SERVER_IP (docs, step 1)."""
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(
        '[superlink]\ndefault = "taciturn"\n\n[superlink.taciturn]\n'
        f'address = "{SERVER_IP}:{port}"\nroot-certificates = "{ca}"\n'
    )
    return {"FLWR_HOME": str(folder)}


def test_the_walkthrough_across_two_network_namespaces(machines, tmp_path):
    server_ns, nodes_ns = machines
    processes = Processes(tmp_path)
    server, operator = tmp_path / "server", tmp_path / "operator"
    port = free_port()  # the doc's 9093; a free one, so that tests beside this one never collide
    try:
        # 1. credentials, on the server
        server.mkdir()
        done = processes.run(
            "taciturn", "deploy", "certs", "creds", "--host", SERVER_IP, "--nodes", "2", "--days", "30",
            cwd=server, timeout=BOOT_S,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        creds = server / "creds"
        # each node machine gets ca.crt and its own key; and holds its own data
        sites = []
        for i, n in ((1, 24), (2, 40)):
            node = tmp_path / f"node-{i}"
            node.mkdir()
            shutil.copy(creds / "ca.crt", node / "ca.crt")
            shutil.copy(creds / f"node-{i}", node / f"node-{i}")
            rng = np.random.default_rng(i)
            y = rng.integers(0, 3, n + 10)
            x = (rng.normal(size=(n + 10, 5)) + y[:, None]).astype(np.float32)
            np.savez(node / "site.npz", x_train=x[:n], y_train=y[:n], x_test=x[n:], y_test=y[n:])
            sites.append(node / "site.npz")
        server_home = flwr_home(tmp_path / "server-home", port, creds / "ca.crt")

        # 2. the SuperLink, persistent, listening on the server's network
        processes.start(
            "superlink", port, "flower-superlink",
            "--ssl-ca-certfile", "creds/ca.crt", "--ssl-certfile", "creds/server.crt",
            "--ssl-keyfile", "creds/server.key", "--enable-supernode-auth",
            "--disable-runtime-dependency-installation", "--database", "superlink.db",
            "--host", "0.0.0.0", "--port", str(port),
            netns=server_ns, cwd=server, env=server_home,
        )  # fmt: skip

        def register(i: int) -> bool:
            key = f"creds/node-{i}.pub"
            done = processes.run(
                "flwr", "supernode", "register", key, "taciturn",
                netns=server_ns, cwd=server, env=server_home, timeout=BOOT_S,
            )  # fmt: skip
            return done.returncode == 0

        for i in (1, 2):  # once the SuperLink answers
            wait_for(lambda i=i: register(i), BOOT_S, f"node-{i}.pub was never registered")

        # 3. the nodes, on their machine
        for i in (1, 2):
            processes.start(
                f"node-{i}", free_port(), "taciturn", "deploy", "node",
                "--superlink", f"{SERVER_IP}:{port}", "--root-certificates", "ca.crt",
                "--auth-supernode-private-key", f"node-{i}", "--port", str(free_port()),
                "--node-config", f'clients="{i - 1}" state-dir="state" data.path="site.npz"',
                netns=nodes_ns, cwd=tmp_path / f"node-{i}",
            )  # fmt: skip

        # 4. the run, submitted from the nodes' machine; its run directory is the server's
        operator.mkdir()
        run_config = {
            "name": "silo",
            "rounds": 2,
            "data": {"dataset": "clients", "path": "/srv/clients"},
            "partition": {"kind": "given"},
            "model": {"kind": "logreg"},
            "algorithm": {"name": "fedavg", "fraction": 1.0, "local": {"batch_size": 8, "lr": 0.1}},
            "eval": {"every": 2},
        }
        config = tiny_config(**run_config)
        from taciturn.experiments.config import to_toml

        (operator / "silo.toml").write_text(to_toml(config))
        operator_home = flwr_home(tmp_path / "operator-home", port, creds / "ca.crt")
        done = processes.run(
            "taciturn", "deploy", "app", "silo.toml",
            "--app", "app", "--out", "runs/silo", "--min-nodes", "2",
            cwd=operator, timeout=BOOT_S,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        streamed = processes.run(
            "flwr", "run", "app", "taciturn", "--stream",
            netns=nodes_ns, cwd=operator, env=operator_home, timeout=RUN_S,
        )  # fmt: skip
        deployed = RunDir(server / "runs" / "silo")
        assert (deployed.path / "report.html").exists(), streamed.stdout + processes.log("superlink")
        assert not (operator / "runs").exists()  # resolved on the server, not where it was submitted
        assert "round 2: 2 of 2 picked clients trained" in streamed.stdout

        # 5. the same clients' data simulated: the same numbers
        both = tmp_path / "both"
        both.mkdir()
        for i, site in enumerate(sites):
            shutil.copy(site, both / f"site-{i}.npz")
        simulated = start(
            tiny_config(**(run_config | {"data": {"dataset": "clients", "path": str(both)}})),
            tmp_path / "simulated",
            progress=False,
        )
        got, expected = rows(deployed), rows(simulated)
        assert all(close_enough(a, b) for a, b in zip(got, expected, strict=True)), (got, expected)
    finally:
        processes.close()

"""End to end on loopback: a SuperLink with TLS and SuperNode authentication, two SuperNodes with
their own data and state folders, a run started with `flwr run`; the run directory it writes holds
the simulation's numbers. A SuperNode with an unregistered key is refused, and one without the CA
certificate cannot connect. Real processes, free ports, bounded waits, all ended in teardown."""

import json
import time

import pytest

pytest.importorskip("flwr")

from taciturn.deploy.app_folder import write_app
from taciturn.deploy.certs import make_credentials
from taciturn.experiments.runner import start
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config
from tests.deploy_processes import Processes, free_port

BOOT_S = 180  # generous: Flower's processes start slowly on a busy machine; a healthy one needs seconds
RUN_S = 600


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.close()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise TimeoutError(what)


def close_enough(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        same = abs(x - y) <= 1e-6 * max(1.0, abs(y)) if isinstance(y, float) else x == y
        if not same:
            return False
    return True


def test_a_deployed_run_over_tls_with_node_auth_equals_its_simulation(tmp_path, processes):
    config = tiny_config(
        rounds=2,
        partition={"kind": "dirichlet", "num_clients": 2, "alpha": 1.0, "min_size": 5},
        algorithm={"name": "scaffold", "fraction": 1.0, "local": {"batch_size": 16, "lr": 0.1}},
    )
    creds = make_credentials(tmp_path / "creds", nodes=3)
    link = free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n\n[superlink.local]\n'
        f'address = "127.0.0.1:{link}"\nroot-certificates = "{creds["ca.crt"]}"\n'
    )
    processes.start(
        "superlink", link, "flower-superlink",
        "--ssl-ca-certfile", str(creds["ca.crt"]),
        "--ssl-certfile", str(creds["server.crt"]),
        "--ssl-keyfile", str(creds["server.key"]),
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--host", "127.0.0.1", "--port", str(link),
    )  # fmt: skip
    processes.wait_for_port(link, BOOT_S)
    for i in (1, 2):  # node 3's key is never registered
        done = processes.run(
            "flwr", "supernode", "register", str(creds[f"node-{i}.pub"]), "local", timeout=BOOT_S
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def node(name, key, clients, *tls, retries=()):
        port = free_port()
        processes.start(
            name, port, "flower-supernode", *tls,
            "--superlink", f"127.0.0.1:{link}", "--port", str(port),
            "--auth-supernode-private-key", str(creds[key]),
            "--node-config", f'clients="{clients}" state-dir="{tmp_path / name}"', *retries,
        )  # fmt: skip

    with_ca = ("--root-certificates", str(creds["ca.crt"]))
    give_up = ("--max-retries", "2", "--max-wait-time", "30")
    node("node-1", "node-1", "0", *with_ca)
    node("node-2", "node-2", "1", *with_ca)
    node("stranger", "node-3", "0", *with_ca, retries=give_up)
    node("no-ca", "node-1", "0", retries=give_up)  # a registered key, but it cannot check the SuperLink

    app = tmp_path / "app"
    write_app(app, config, tmp_path / "deployed", round_timeout=RUN_S)
    started = processes.run("flwr", "run", str(app), "local", timeout=BOOT_S)
    assert started.returncode == 0, started.stdout + started.stderr
    deployed = RunDir(tmp_path / "deployed")
    wait_for(lambda: (deployed.path / "report.html").exists(), RUN_S, "the deployed run did not finish")

    simulated = start(config, tmp_path / "simulated", progress=False)
    drop = ("wall_s",)
    rows = [{k: v for k, v in r.items() if k not in drop} for r in deployed.read_metrics()]
    expected = [{k: v for k, v in r.items() if k not in drop} for r in simulated.read_metrics()]
    assert len(rows) == len(expected) == 3
    assert all(close_enough(a, b) for a, b in zip(rows, expected, strict=True)), (rows, expected)
    assert json.loads(deployed.info.read_text())["engine"].startswith("executor: flower")
    # SCAFFOLD's control variates live on the nodes' disks: round 1's committed (the server's round-2
    # request acknowledged it), round 2's staged (no later request has acknowledged it yet)
    for name, client in (("node-1", 0), ("node-2", 1)):
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == [
            f"client-{client}.round-2.staged.safetensors",
            f"client-{client}.safetensors",
        ]

    refusals = {
        "stranger": "Failed to activate SuperNode",  # TLS is fine, the SuperLink does not know its key
        "no-ca": "CERTIFICATE_VERIFY_FAILED",  # it cannot verify the SuperLink's certificate
    }
    for name, reason in refusals.items():
        proc, _ = processes.procs[name]
        assert wait_for(lambda p=proc: p.poll() is not None, BOOT_S, f"{name} kept running")
        assert proc.returncode != 0 and reason in processes.log(name), processes.log(name)

"""End to end on loopback, real processes: a SuperLink with TLS and SuperNode authentication, three
registered SuperNodes (one client each, their own state folders), runs started with `flwr run`.

One SuperLink and one node set serve every run of the module (start-up is the cost): FedAvg,
SCAFFOLD and event-based ADMM, 3 rounds each, write the run directory of their simulation; a node
killed in the middle of a run has its client dropped, and once restarted it trains from the state
it persisted; a node with an unregistered key is refused, and one without the CA certificate
cannot connect. Free ports, bounded waits, every process ended in teardown."""

import itertools
import json

import pytest

pytest.importorskip("flwr")

from taciturn.experiments.runner import start
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config
from tests.deploy_processes import Federation, Processes
from tests.test_deploy import ALGORITHMS as IN_PROCESS
from tests.test_deploy import rows

BOOT_S = 180  # generous: Flower's processes start slowly on a busy machine; a healthy one needs seconds
RUN_S = 600
NODES = 3  # node i hosts client i - 1
# the in-process tests' algorithms, every client picked every round (one client per node)
ALGORITHMS = {name: algorithm | {"fraction": 1.0} for name, algorithm in IN_PROCESS.items()}


def config(name: str, algorithm: str):
    return tiny_config(
        name=name,
        rounds=3,
        partition={"kind": "dirichlet", "num_clients": NODES, "alpha": 1.0, "min_size": 5},
        algorithm=ALGORITHMS[algorithm],
    )


def close_enough(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        same = abs(x - y) <= 1e-6 * max(1.0, abs(y)) if isinstance(y, float) else x == y
        if not same:
            return False
    return True


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("federation")
    processes = Processes(root)
    try:
        federation = Federation(root, processes, [str(c) for c in range(NODES)], BOOT_S)
        federation.strangers()
        yield federation
    finally:
        processes.close()


def submit(federation: Federation, cfg) -> RunDir:
    return federation.submit(cfg, round_timeout=RUN_S)


def finish(federation: Federation, rundir: RunDir) -> RunDir:
    return federation.finish(rundir, RUN_S)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_deployed_run_over_tls_with_node_auth_equals_its_simulation(federation, tmp_path, algorithm):
    cfg = config(f"e2e-{algorithm}", algorithm)
    deployed = finish(federation, submit(federation, cfg))
    simulated = start(cfg, tmp_path / "simulated", progress=False)
    got, expected = rows(deployed), rows(simulated)
    assert len(got) == len(expected) == 4  # round 0's evaluation, then 3 rounds
    assert all(close_enough(a, b) for a, b in zip(got, expected, strict=True)), (got, expected)
    assert json.loads(deployed.info.read_text())["engine"].startswith("executor: flower")


def test_a_killed_node_is_dropped_and_catches_up_with_its_persisted_state(federation):
    """SCAFFOLD: node 3 (client 2) is stopped when its round-2 request arrives and restarted at once."""
    cfg = config("e2e-kill", "scaffold")
    deployed, folder, held = federation.kill_and_restart(3, 2, lambda: submit(federation, cfg))
    round_1_state = held["client-2.round-1.safetensors"]  # what it persisted from round 1
    finish(federation, deployed)

    delivered = [r["delivered_up"] for r in deployed.read_metrics()]
    assert [b - a for a, b in itertools.pairwise(delivered)] == [3, 2, 3]  # dropped in round 2, back in 3
    # round 3's request named round 1 (accepted, and in effect at the round-2 checkpoint): the node
    # trained from that state, unchanged, and dropped whatever it made of round 2
    assert (folder / "client-2.round-1.safetensors").read_bytes() == round_1_state
    assert sorted(p.name for p in folder.glob("*.safetensors")) == [
        "client-2.round-1.safetensors",
        "client-2.round-3.safetensors",
    ]
    never_down = federation.state_dir(1) / folder.name
    assert sorted(p.name for p in never_down.iterdir()) == [
        "client-0.round-2.safetensors",
        "client-0.round-3.safetensors",
    ]


def test_an_unregistered_node_and_a_node_without_the_ca_are_refused(federation):
    refusals = {
        "stranger": "Failed to activate SuperNode",  # TLS is fine, the SuperLink does not know its key
        "no-ca": "CERTIFICATE_VERIFY_FAILED",  # it cannot verify the SuperLink's certificate
    }
    for name, reason in refusals.items():
        assert federation.refused(name, reason), federation.log(name)

"""A silo federation with real processes on loopback: each node holds its own client's data, the
server holds none.

Three nodes (`taciturn deploy node`: a long-lived ClientApp each) read three .npz files of
different sizes from their own node configs; the run's config names a data path that does not
exist on the server. The server learns the clients' sizes and shapes from the nodes, the nodes
evaluate the global model on their own held-out splits, and the metrics equal the simulation of
the same three files. The operator sees the rounds in `flwr run --stream`; a node that cannot read
its data fails the run before round 1, as a failed Flower run with the reason in the stream; a
SuperLink restarted with its database gets its nodes back with no new registration. One SuperLink
and node set for the module, free ports, bounded waits, every process ended in teardown."""

import json
import os
import signal

import numpy as np
import pytest

pytest.importorskip("flwr")

from taciturn.experiments.runner import start
from tests.conftest import tiny_config
from tests.deploy_processes import Federation, Processes, wait_for
from tests.test_deploy import rows
from tests.test_deploy_e2e import close_enough

BOOT_S = 180
RUN_S = 300
SIZES = (20, 35, 50)  # each client's training samples; its held-out split is half as many


def site_files(folder):
    """Three clients' own data: 6 features, 3 classes, different sizes; one file each."""
    rng = np.random.default_rng(7)
    folder.mkdir()
    centres = rng.normal(size=(3, 6)) * 2
    for i, n in enumerate(SIZES):
        y = rng.integers(0, 3, n + n // 2)
        x = (centres[y] + rng.normal(size=(len(y), 6))).astype(np.float32)
        np.savez(folder / f"site-{i}.npz", x_train=x[:n], y_train=y[:n], x_test=x[n:], y_test=y[n:])
    return [folder / f"site-{i}.npz" for i in range(3)]


def config(name: str, path, **overrides):
    settings = {
        "name": name,
        "rounds": 3,
        "data": {"dataset": "clients", "path": str(path)},
        "partition": {"kind": "given"},
        "algorithm": {"name": "scaffold", "fraction": 1.0, "local": {"batch_size": 8, "lr": 0.1}},
        "eval": {"every": 3},  # round 0 and the last: each federated evaluation is one more exchange
    }
    return tiny_config(**(settings | overrides))


@pytest.fixture(scope="module")
def silo(tmp_path_factory):
    root = tmp_path_factory.mktemp("silo")
    files = site_files(root / "sites")
    processes = Processes(root)
    try:
        data = [f'data.path="{f}"' for f in files]
        yield Federation(root, processes, ["0", "1", "2"], BOOT_S, node_data=data), files
    finally:
        processes.close()


def test_a_silo_federation_trains_on_each_nodes_own_data_and_equals_its_simulation(silo, tmp_path):
    federation, files = silo
    nowhere = tmp_path / "the-server-has-no-data"  # the run's [data] path: absent on the server
    deployed = federation.finish(federation.submit(config("silo", nowhere), RUN_S), RUN_S)
    stream = federation.streamed("silo", RUN_S)
    simulated = start(config("silo", files[0].parent), tmp_path / "simulated", progress=False)

    got, expected = rows(deployed), rows(simulated)
    assert len(got) == 2, got
    assert all(close_enough(a, b) for a, b in zip(got, expected, strict=True)), (got, expected)
    held_out = sum(n // 2 for n in SIZES)
    assert all(row["eval_on"] == "clients" and row["eval_samples"] == held_out for row in got)
    info = json.loads(deployed.info.read_text())
    assert info["client_sizes"] == list(SIZES) and info["evaluation"].startswith("federated")
    assert not deployed.partition.exists()  # the clients' labels never reached the server
    assert not nowhere.exists()
    # what the operator watches: each round, in the stream
    for round in (1, 2, 3):
        assert f"round {round}: 3 of 3 picked clients trained" in stream, stream
    assert "taciturn ERROR" not in stream and federation.status("silo") == "finished:completed"


def test_a_node_without_its_data_fails_the_run_before_round_1_where_the_operator_looks(silo, tmp_path):
    """Node 3 restarted with a data path that does not exist: the run stops before round 1 as a
    failed Flower run, and the stream names the node and the reason (not a run that "finishes"
    without its clients)."""
    federation, files = silo
    federation.processes.stop("node-3")
    federation.node_data[2] = f'data.path="{tmp_path / "lost.npz"}"'
    federation.node("node-3", 3, *federation.with_ca)
    try:
        deployed = federation.submit(config("lost", tmp_path / "nowhere"), RUN_S)
        stream = federation.streamed("lost", RUN_S)
        assert federation.status("lost") == "finished:failed"
        assert "the run failed: DeployError: before round 1: node" in stream, stream
        assert "lost.npz does not exist" in stream
        assert not deployed.metrics.exists()
    finally:
        federation.processes.stop("node-3")
        federation.node_data[2] = f'data.path="{files[2]}"'
        federation.node("node-3", 3, *federation.with_ca)


def test_a_restarted_superlink_keeps_its_nodes(silo, tmp_path):
    """kill -9 of the SuperLink, started again with its --database: the nodes reconnect on their
    own (nobody registers them again) and the next run trains all three."""
    federation, _ = silo
    proc, _ = federation.processes.procs.pop("superlink")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    federation.start_link()
    cfg = config("after-restart", tmp_path / "nowhere", rounds=1)
    deployed = federation.finish(federation.submit(cfg, RUN_S), RUN_S)
    assert rows(deployed)[-1]["delivered_up"] == 3 and rows(deployed)[-1]["failed"] == 0
    wait_for(lambda: federation.status("after-restart") == "finished:completed", BOOT_S, "run status")

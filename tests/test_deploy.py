"""Deployed rounds (taciturn.deploy) against the simulation: same numbers, same payload bytes."""

import csv
import dataclasses
import itertools
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from taciturn.core.codec import CodecError, decode
from taciturn.core.ledger import PAYLOAD
from taciturn.core.rng import SERVER, Streams
from taciturn.deploy import protocol
from taciturn.deploy.grid_executor import _reasons
from taciturn.deploy.inprocess import InProcessGrid, ServerStopped
from taciturn.deploy.node_state import NodeStateStore
from taciturn.deploy.server_app import run_deployed
from taciturn.deploy.settings import DeployError, NodeSettings, ServerSettings, run_folder
from taciturn.engine.pipeline import RoundPart
from taciturn.experiments.config import ConfigError, to_toml
from taciturn.experiments.runner import resume, start
from taciturn.report.rundir import RunDir, RunDirError
from tests.conftest import tiny_config

HOSTS = [[0, 1, 2], [3, 4, 5], [6, 7]]  # three nodes, eight clients
ALGORITHMS = {
    "fedavg": {"name": "fedavg", "fraction": 0.5, "local": {"batch_size": 16, "lr": 0.1}},
    "scaffold": {"name": "scaffold", "fraction": 0.5, "local": {"batch_size": 16, "lr": 0.1}},
    # triggers that fire sometimes: silent uplinks (empty replies) and downlinks with no model
    "event_admm": {
        "name": "event_admm",
        "fraction": 1.0,
        "delta": 0.2,
        "delta_z": 0.1,
        "local": {"steps": 2},
    },
}


def rows(rundir: RunDir, drop=("wall_s",)):
    return [{k: v for k, v in row.items() if k not in drop} for row in rundir.read_metrics()]


def ledger(rundir: RunDir) -> list[dict]:
    with rundir.ledger.open(newline="") as f:
        return list(csv.DictReader(f))


def deploy(config, tmp_path, lose=()):
    grid = InProcessGrid(config, HOSTS, tmp_path / "nodes", lose)
    rundir = run_deployed(grid, ServerSettings(config, tmp_path / "deployed", False, 1.0))
    return rundir, grid


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_deployed_run_equals_its_simulation(tmp_path, algorithm):
    config = tiny_config(rounds=4, algorithm=ALGORITHMS[algorithm])
    simulated = start(config, tmp_path / "simulated", progress=False)
    deployed, grid = deploy(config, tmp_path)
    assert rows(deployed) == rows(simulated)
    payload = ["round", "client", "direction", *PAYLOAD]
    carried = [r for r in ledger(deployed) if r["messages_sent"] != "0"]  # others: frames with no model
    assert [{k: r[k] for k in payload} for r in carried] == [
        {k: r[k] for k in payload} for r in ledger(simulated)
    ]
    # one Flower message a node a round, for all its picked clients; every message crossed the
    # wire, its size split over its clients: each its payload plus a share of a small frame
    wire = {(int(r["round"]), int(r["client"]), r["direction"]): r for r in ledger(deployed)}
    trains = [m for m in grid.requests if m.metadata.message_type == protocol.TRAIN]
    hosts = {c: n for n, clients in enumerate(HOSTS, start=1) for c in clients}
    busy = {(r, hosts[c]) for (r, c, d) in wire if d == "down"}
    assert len(trains) == len(busy)
    for request in trains:
        carried = protocol.read_request(request.content)
        shares = [int(wire[(carried.round, c, "down")]["wire_bytes"]) for c in carried.clients]
        assert sum(shares) == protocol.wire_size(request)
    for row in wire.values():
        assert int(row["bytes_sent"]) < int(row["wire_bytes"]) < int(row["bytes_sent"]) + 1024
    assert all(int(r["wire_bytes"]) == 0 for r in ledger(simulated))


def test_event_admm_sends_empty_messages_when_its_triggers_stay_silent(tmp_path):
    config = tiny_config(rounds=4, algorithm=ALGORITHMS["event_admm"])
    deployed, grid = deploy(config, tmp_path)
    requests = [protocol.read_request(m.content) for m in grid.requests if m.metadata.message_type == "train"]
    no_model = [(r.round, c) for r in requests for c, p in zip(r.clients, r.payloads, strict=True) if not p]
    assert no_model and all(round > 1 for round, _ in no_model)  # round 1 always syncs z
    silent_down = {(str(round), str(client)) for round, client in no_model}
    down_rows = {(r["round"], r["client"]): r for r in ledger(deployed) if r["direction"] == "down"}
    for key in silent_down:  # a frame crossed the wire, no payload was counted
        assert down_rows[key]["bytes_sent"] == "0" and int(down_rows[key]["wire_bytes"]) > 0
    up = [r for r in ledger(deployed) if r["direction"] == "up"]
    assert any(r["messages_sent"] == "0" and int(r["wire_bytes"]) > 0 for r in up)  # silent uplinks


def dropped_uplinks(config) -> set[tuple[int, int]]:
    """Which uplinks the simulated Channel drops: the same seeded draws (core/channel.py)."""
    streams, lost = Streams(config.seed), set()
    for round in range(1, config.rounds + 1):
        picked = streams.numpy(round, SERVER, "select").choice(8, size=4, replace=False)
        for client in picked:
            if streams.numpy(round, int(client), "drop-up").random() < config.channel.drop_up:
                lost.add((round, int(client)))
    return lost


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_a_lost_reply_is_a_dropped_uplink(tmp_path, algorithm):
    """Lose exactly the replies the simulation's Channel drops (one client a node, so a node's
    reply is its client's): the model trains identically, and SCAFFOLD's clients whose reply was
    lost keep their state (the acceptance rule on both sides)."""
    lossy = tiny_config(rounds=5, algorithm=ALGORITHMS[algorithm], channel={"drop_up": 0.3})
    lost = dropped_uplinks(lossy)
    assert 0 < len(lost) < 10
    simulated = start(lossy, tmp_path / "simulated", progress=False)
    config = tiny_config(rounds=5, algorithm=ALGORITHMS[algorithm])
    grid = InProcessGrid(config, [[c] for c in range(8)], tmp_path / "nodes", lost)
    deployed = run_deployed(grid, ServerSettings(config, tmp_path / "deployed", False, 1.0))
    traffic = ("bytes_up", "bytes_down", "messages_up", "delivered_up", "delivered_down", "wall_s")
    assert rows(deployed, traffic) == rows(simulated, traffic)
    down = {(int(r["round"]), int(r["client"])): r for r in ledger(deployed) if r["direction"] == "down"}
    for key in lost:  # no reply: the request is counted as sent, not delivered
        assert down[key]["messages_delivered"] == "0"


def versions(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("client-"))


def read(folder: Path, client: int, round: int) -> bytes:
    return (folder / f"client-{client}.round-{round}.safetensors").read_bytes()


def test_node_state_is_the_version_the_server_names(tmp_path):
    store = NodeStateStore(tmp_path)
    (tmp_path / "notes.txt").write_text("not ours")
    for round in (2, 4, 5):
        store.save(3, round, {"c": torch.full((2,), float(round))})
    store.save(1, 4, {"c": torch.ones(2)})
    store = NodeStateStore(tmp_path)  # a restarted node finds them
    # round 4's uplink was lost or rejected, round 5 is run again by a resumed server: round 2 is in
    # effect, and round 4's version is what the server's last checkpoint names
    state = store.settle(3, accepted=2, kept=4)
    assert torch.equal(state["c"], torch.full((2,), 2.0))
    assert versions(tmp_path) == [
        "client-1.round-4.safetensors",  # another client's, untouched
        "client-3.round-2.safetensors",
        "client-3.round-4.safetensors",
    ]
    assert store.settle(3, accepted=0, kept=0) is None  # none named: a fresh client
    assert versions(tmp_path) == ["client-1.round-4.safetensors"]
    assert (tmp_path / "notes.txt").exists()
    with pytest.raises(DeployError, match="client 3's state after round 2, which the server names, is not"):
        store.settle(3, accepted=2, kept=0)  # never a silent fresh start
    store.save(6, 1, None)  # a client without state (FedAvg's) has an empty version
    assert store.settle(6, accepted=1, kept=0) is None


def test_a_named_state_the_node_lacks_fails_its_clients_loudly(tmp_path):
    """Node 2's state-dir is lost while the server is down: after the resume its clients fail with
    the reason, instead of training from a fresh state as if nothing happened."""
    import shutil

    config = tiny_config(rounds=4, algorithm=ALGORITHMS["scaffold"] | {"fraction": 1.0})
    settings = ServerSettings(config, tmp_path / "run", False, 5.0)
    with pytest.raises(ServerStopped):
        run_deployed(InProcessGrid(config, HOSTS, tmp_path / "nodes", stop_in=3), settings)
    shutil.rmtree(tmp_path / "nodes" / "node2")
    resumed = run_deployed(
        InProcessGrid(config, HOSTS, tmp_path / "nodes"), dataclasses.replace(settings, resume=True)
    )
    events = [json.loads(line) for line in resumed.events.read_text().splitlines()]
    failed = {
        (e["round"], e["client"]) for e in events if e["event"] == "failed" and "is not in" in e["reason"]
    }
    assert failed == {(r, c) for r in (3, 4) for c in (3, 4, 5)}
    assert [row["failed"] for row in resumed.read_metrics()] == [0, 0, 0, 3, 6]


def test_bad_settings_fail_clearly():
    with pytest.raises(DeployError, match="clients"):
        NodeSettings.from_node_config({"state-dir": "/tmp/x"})
    with pytest.raises(DeployError, match="expected client ids"):
        NodeSettings.from_node_config({"clients": "a,b", "state-dir": "/tmp/x"})
    with pytest.raises(DeployError, match="network decides"):
        ServerSettings.from_run_config({"taciturn-config": "[channel]\ndrop_up = 0.1\n", "out": "/tmp/run"})
    with pytest.raises(DeployError, match="min-nodes"):
        ServerSettings.from_run_config({"taciturn-config": "", "out": "/tmp/run", "min-nodes": 0})
    with pytest.raises(DeployError, match="not both"):
        both = {"overwrite": True, "resume": True}
        ServerSettings.from_run_config({"taciturn-config": "", "out": "/tmp/run"} | both)


def test_a_resume_continues_only_the_run_it_started(tmp_path):
    config = tiny_config(rounds=2)
    deploy(config, tmp_path)
    other = tiny_config(rounds=3)
    grid = InProcessGrid(other, HOSTS, tmp_path / "nodes")
    with pytest.raises(DeployError, match="another config"):
        run_deployed(grid, ServerSettings(other, tmp_path / "deployed", False, 1.0, resume=True))
    with pytest.raises(RunDirError, match="not a run directory"):
        run_deployed(grid, ServerSettings(other, tmp_path / "none", False, 1.0, resume=True))
    # the state folder is the run's (config and run directory), not Flower's run id
    run = {"taciturn-config": "a", "out": "/r"}
    assert run_folder(run) == run_folder(run | {"resume": True})
    assert run_folder(run) != run_folder(run | {"out": "/s"})


def test_app_folder_carries_the_config_flower_hands_the_server(tmp_path):
    import tomllib

    from taciturn.deploy.app_folder import write_app

    config = tiny_config(rounds=2)
    pyproject = write_app(tmp_path / "app", config, tmp_path / "run", round_timeout=30, min_nodes=2)
    flwr = tomllib.loads(pyproject.read_text())["tool"]["flwr"]
    assert flwr["app"]["components"] == {
        "serverapp": "taciturn.deploy.server_app:app",
        "clientapp": "taciturn.deploy.client_app:app",
    }
    settings = ServerSettings.from_run_config(flwr["app"]["config"])
    assert settings.config == config and settings.out == (tmp_path / "run").resolve()
    assert settings.round_timeout == 30.0 and settings.overwrite is False and settings.min_nodes == 2
    with pytest.raises(DeployError, match="exists"):
        write_app(tmp_path / "app", config, tmp_path / "run")
    with pytest.raises(DeployError, match="network decides"):
        write_app(tmp_path / "other", tiny_config(channel={"drop_up": 0.1}), tmp_path / "run")
    # what only the runner refused before (one list of refusals now): the app folder is never written
    with pytest.raises(DeployError, match="simulation only"):
        write_app(tmp_path / "other", tiny_config(compression={"up": ["fp16"]}), tmp_path / "run")
    with pytest.raises(DeployError, match=r"\[eval.clients\] deployed runs"):
        write_app(tmp_path / "other", tiny_config(eval={"every": 1, "clients": 0.5}), tmp_path / "run")
    assert not (tmp_path / "other").exists()


def test_the_run_directory_is_resolved_on_the_server_not_where_the_run_was_submitted(tmp_path, monkeypatch):
    import tomllib

    from taciturn.deploy.app_folder import write_app

    submitter, server = tmp_path / "laptop", tmp_path / "server"
    submitter.mkdir(), server.mkdir()
    monkeypatch.chdir(submitter)
    pyproject = write_app(Path("app"), tiny_config(), Path("runs/x"), min_trained=2, patience=4)
    flwr = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]
    assert flwr["out"] == "runs/x" and flwr["min-trained"] == 2 and flwr["patience"] == 4
    monkeypatch.chdir(server)  # the ServerApp runs where the SuperLink was started
    settings = ServerSettings.from_run_config(flwr)
    assert settings.out == server / "runs" / "x"
    assert (settings.min_trained, settings.patience) == (2, 4)
    with pytest.raises(DeployError, match="patience must be an integer >= 1"):
        ServerSettings.from_run_config(flwr | {"patience": 0})


def _sans(cert):
    from cryptography import x509

    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] + names.get_values_for_type(
        x509.DNSName
    )


def test_credentials_chain_to_a_ca_that_is_kept_and_cover_loopback(tmp_path):
    """--host 10.77.0.1 only: the certificate also names 127.0.0.1 and localhost, where the
    SuperLink's own ServerApp connects (else every run stays pending); the CA key is kept (0600),
    private keys are the owner's only, and the validity is the one asked for."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

    from taciturn.deploy.certs import make_credentials

    files = make_credentials(tmp_path, hosts=("10.77.0.1",), nodes=2, days=90)
    ca = x509.load_pem_x509_certificate(files["ca.crt"].read_bytes())
    server = x509.load_pem_x509_certificate(files["server.crt"].read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
    assert _sans(server) == ["10.77.0.1", "127.0.0.1", "localhost"]
    lifetime = server.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=89) < lifetime <= datetime.timedelta(days=90)
    for i in (1, 2):
        key = load_ssh_private_key(files[f"node-{i}"].read_bytes(), None)
        assert key.public_key() == load_ssh_public_key(files[f"node-{i}.pub"].read_bytes())
    for private in ("ca.key", "server.key", "node-1", "node-2"):  # readable by their owner only
        assert (tmp_path / private).stat().st_mode & 0o077 == 0


def test_certificates_replace_a_link_in_their_place_and_never_write_through_it(tmp_path):
    from taciturn.deploy.certs import make_credentials

    keys, outside = tmp_path / "keys", tmp_path / "notes.txt"
    outside.write_text("mine")
    keys.mkdir()
    for name in ("ca.crt", "server.crt", "node-1.pub"):
        (keys / name).symlink_to(outside)
    with pytest.raises(DeployError, match="--overwrite"):
        make_credentials(keys, nodes=1)
    make_credentials(keys, nodes=1, overwrite=True)
    assert outside.read_text() == "mine"
    assert not any((keys / name).is_symlink() for name in ("ca.crt", "server.crt", "node-1.pub"))
    assert (keys / "ca.crt").read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")


def test_a_node_and_a_host_are_added_later_without_rekeying_anyone(tmp_path):
    from cryptography import x509

    from taciturn.deploy.certs import make_credentials

    make_credentials(tmp_path, hosts=("10.77.0.1",), nodes=2)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert make_credentials(tmp_path, hosts=("10.77.0.1",), nodes=2) == {}  # nothing to do
    added = make_credentials(tmp_path, hosts=("10.77.0.1", "server.example"), nodes=3)
    assert sorted(added) == ["node-3", "node-3.pub", "server.crt", "server.key"]
    for kept in ("ca.crt", "ca.key", "node-1", "node-1.pub", "node-2", "node-2.pub"):
        assert (tmp_path / kept).read_bytes() == before[kept]  # the nodes need nothing new
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    server.verify_directly_issued_by(ca)
    assert _sans(server) == ["10.77.0.1", "127.0.0.1", "server.example", "localhost"]
    assert sorted(make_credentials(tmp_path, hosts=(), nodes=3, renew=True)) == ["server.crt", "server.key"]
    # a server certificate from another CA is the user's: never replaced
    other = tmp_path / "other"
    make_credentials(other, nodes=0)
    (tmp_path / "server.crt").write_bytes((other / "server.crt").read_bytes())
    with pytest.raises(DeployError, match="not signed by this folder's CA"):
        make_credentials(tmp_path, hosts=("new.example",), nodes=3)
    (tmp_path / "ca.key").unlink()
    with pytest.raises(DeployError, match=r"without its key ca\.key"):
        make_credentials(tmp_path, nodes=4)


def test_a_node_down_for_two_rounds_catches_up_with_its_persisted_state(tmp_path):
    """Node 2 (clients 3, 4, 5) dies after round 1 and restarts before round 4 with a new node id."""
    scaffold = ALGORITHMS["scaffold"] | {"fraction": 1.0}
    config = tiny_config(rounds=4, algorithm=scaffold)
    grid = InProcessGrid(config, HOSTS, tmp_path / "nodes", outages={2: (2, 3)})
    deployed = run_deployed(grid, ServerSettings(config, tmp_path / "deployed", False, 5.0))
    delivered = [row["delivered_up"] for row in deployed.read_metrics()]
    assert [b - a for a, b in itertools.pairwise(delivered)] == [8, 5, 5, 8]  # its clients dropped, then back
    trains = [
        (m.metadata.dst_node_id, protocol.read_request(m.content))
        for m in grid.requests
        if m.metadata.message_type == "train"
    ]
    back = {
        c: (node, accepted)
        for node, r in trains
        for c, accepted in zip(r.clients, r.accepted, strict=True)
        if r.round == 4 and c in (3, 4, 5)
    }
    assert back == {3: (102, 1), 4: (102, 1), 5: (102, 1)}  # the new node, told round 1 was accepted

    # it trained round 4 from its round-1 state, and that is the state a node that never went
    # down has after round 1
    steady = tiny_config(rounds=2, algorithm=scaffold)
    run_deployed(
        InProcessGrid(steady, HOSTS, tmp_path / "steady"), ServerSettings(steady, tmp_path / "s", False, 5.0)
    )
    restarted = tmp_path / "nodes" / "node2" / run_folder(grid.run_config)
    never_down = tmp_path / "steady" / "node2" / run_folder({"taciturn-config": to_toml(steady)})
    assert versions(restarted) == [f"client-{c}.round-{r}.safetensors" for c in (3, 4, 5) for r in (1, 4)]
    for client in (3, 4, 5):
        assert read(restarted, client, 1) == read(never_down, client, 1)


def test_report_and_compare_read_a_deployed_run_like_a_simulated_one(tmp_path):
    from taciturn.experiments import types

    config = tiny_config(rounds=2, algorithm=ALGORITHMS["fedavg"])
    deployed, _ = deploy(config, tmp_path)
    simulated = types.start(config, tmp_path / "simulated", progress=False)
    assert (deployed.path / "report.html").exists()  # the ServerApp writes it, as `taciturn run` does
    _, table = types.compare([deployed, simulated], tmp_path / "compare")
    by_run = list(table.values())
    assert len(by_run) == 2 and by_run[0]["MB up"] == by_run[1]["MB up"]
    assert by_run[0]["final accuracy"] == by_run[1]["final accuracy"]


def npz_data(path: str):
    """A data.factory reading one .npz file (the four tensors taciturn.data.user accepts); it
    leaves ``<path>.read`` behind, so a test sees which files were read."""
    import numpy as np

    Path(path + ".read").touch()
    d = np.load(path)
    return d["x"], d["y"], d["x_test"], d["y_test"]


def npz_arrays() -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    return {
        "x": rng.normal(size=(240, 6)).astype(np.float32),
        "y": rng.integers(0, 3, 240),
        "x_test": rng.normal(size=(60, 6)).astype(np.float32),
        "y_test": rng.integers(0, 3, 60),
    }


def test_each_node_reads_the_data_files_at_its_own_paths(tmp_path):
    """The run's [data] names the server's copy; each node's data.* setting points at its own."""
    import numpy as np

    arrays = npz_arrays()
    paths = {}
    for where in ("server", "node1", "node2", "node3"):
        (tmp_path / where).mkdir()
        paths[where] = str(tmp_path / where / "data.npz")
        np.savez(paths[where], **arrays)
    data = {
        "dataset": "factory",
        "factory": "tests.test_deploy:npz_data",
        "kwargs": {"path": paths["server"]},
    }
    config = tiny_config(rounds=2, data=data, algorithm=ALGORITHMS["scaffold"])
    simulated = start(config, tmp_path / "simulated", progress=False)
    Path(paths["server"] + ".read").unlink()
    node_data = {n: {"data.kwargs.path": paths[f"node{n}"]} for n in (1, 2, 3)}
    grid = InProcessGrid(config, HOSTS, tmp_path / "nodes", node_data=node_data)
    deployed = run_deployed(grid, ServerSettings(config, tmp_path / "deployed", False, 5.0))
    assert rows(deployed) == rows(simulated)
    assert all(Path(p + ".read").exists() for p in paths.values())  # the server its copy, each node its own


@pytest.mark.parametrize("algorithm", ["scaffold", "event_admm"])
def test_a_resumed_server_loses_nothing(tmp_path, algorithm):
    """The server dies in round 4 (checkpoint every 2: after round 2), after the nodes served round
    4's requests; resumed, it runs rounds 3-5 again. SCAFFOLD's c_i and event ADMM's duals and
    trigger memory (it has silent clients) make any client state lost or taken twice visible: the
    metrics, ledger and every node's files equal those of an uninterrupted run, and the metrics the
    simulation's."""
    config = tiny_config(rounds=5, algorithm=ALGORITHMS[algorithm])
    settings = ServerSettings(config, tmp_path / "resumed", False, 5.0)
    with pytest.raises(ServerStopped):
        run_deployed(InProcessGrid(config, HOSTS, tmp_path / "nodes", stop_in=4), settings)
    assert [row["round"] for row in rows(RunDir(settings.out))] == [0, 1, 2, 3]
    folder = run_folder({"taciturn-config": to_toml(config)})
    served = [name for node in (1, 2, 3) for name in versions(tmp_path / "nodes" / f"node{node}" / folder)]
    assert any(".round-4." in name for name in served)  # what the resumed server must not take
    with pytest.raises(RunDirError, match="deployed run"):
        resume(settings.out, progress=False)  # not as a simulation
    grid = InProcessGrid(config, HOSTS, tmp_path / "nodes")
    resumed = run_deployed(grid, dataclasses.replace(settings, resume=True))
    trains = [protocol.read_request(m.content) for m in grid.requests if m.metadata.message_type == "train"]
    assert trains[0].round == 3 and max(trains[0].kept) > 0  # round 3 again, naming the checkpoint's states

    steady = run_deployed(
        InProcessGrid(config, HOSTS, tmp_path / "steady"), ServerSettings(config, tmp_path / "s", False, 5.0)
    )
    simulated = start(config, tmp_path / "simulated", progress=False)
    assert rows(resumed) == rows(steady) == rows(simulated)
    assert ledger(resumed) == ledger(steady)
    for node in ("node1", "node2", "node3"):
        a, b = tmp_path / "nodes" / node / folder, tmp_path / "steady" / node / folder
        assert versions(a) == versions(b)
        assert all((a / name).read_bytes() == (b / name).read_bytes() for name in versions(a))


def test_a_node_whose_data_splits_otherwise_is_left_out(tmp_path, caplog):
    """Node 2 reads a copy with 40 rows fewer: its clients' sizes are not the run's, so the server
    sends it no work (its updates would come from other rows than the run's partition)."""
    import numpy as np

    arrays = npz_arrays()
    np.savez(tmp_path / "run.npz", **arrays)
    np.savez(tmp_path / "short.npz", **(arrays | {"x": arrays["x"][:200], "y": arrays["y"][:200]}))
    data = {
        "dataset": "factory",
        "factory": "tests.test_deploy:npz_data",
        "kwargs": {"path": str(tmp_path / "run.npz")},
    }
    config = tiny_config(rounds=2, data=data, algorithm=ALGORITHMS["fedavg"] | {"fraction": 1.0})
    grid = InProcessGrid(
        config, HOSTS, tmp_path / "nodes", node_data={2: {"data.kwargs.path": str(tmp_path / "short.npz")}}
    )
    deployed = run_deployed(grid, ServerSettings(config, tmp_path / "deployed", False, 5.0))
    assert {m.metadata.dst_node_id for m in grid.requests if m.metadata.message_type == "train"} == {1, 3}
    assert [row["delivered_up"] for row in deployed.read_metrics()] == [0, 5, 10]  # 5 of the 8 clients
    assert "node 2 is left out: its clients' sizes" in caplog.text


def test_a_query_reply_names_each_client_with_its_size():
    reply = protocol.query_reply(protocol.Hosted("0.1.0", {3: 40, 5: 0}))
    assert protocol.read_query_reply(reply) == protocol.Hosted("0.1.0", {3: 40, 5: 0})
    bad = protocol.query_reply(protocol.Hosted("0.1.0", {3: 40}))
    bad[protocol.RECORD]["sizes"] = [40, 2]
    with pytest.raises(CodecError, match="1 clients and 2 sizes"):
        protocol.read_query_reply(bad)


# ----- per-client data: each node its own clients' files, the server none -----
def silo_files(folder, sizes=(9, 20, 14, 31)):
    """Four clients' own data of different sizes, one file each (held-out splits of a third)."""
    import numpy as np

    folder.mkdir()
    rng = np.random.default_rng(5)
    for i, n in enumerate(sizes):
        y = rng.integers(0, 3, n + n // 3)
        x = (rng.normal(size=(len(y), 6)) + y[:, None]).astype(np.float32)
        np.savez(folder / f"client-{i}.npz", x_train=x[:n], y_train=y[:n], x_test=x[n:], y_test=y[n:])
    return sorted(folder.iterdir())


def silo_config(path, algorithm="scaffold", **overrides):
    settings = {
        "rounds": 3,
        "data": {"dataset": "clients", "path": str(path)},
        "partition": {"kind": "given"},
        "algorithm": ALGORITHMS[algorithm] | {"fraction": 1.0},
    }
    return tiny_config(**(settings | overrides))


def silo_nodes(tmp_path, files):
    """Node 1 holds clients 0 and 1 (a folder of two files), node 2 client 2, node 3 client 3."""
    import shutil

    both = tmp_path / "node1-data"
    both.mkdir()
    for f in files[:2]:
        shutil.copy(f, both / f.name)
    return [[0, 1], [2], [3]], {
        1: {"data.path": str(both)},
        2: {"data.path": str(files[2])},
        3: {"data.path": str(files[3])},
    }


@pytest.mark.parametrize("algorithm", ["scaffold", "event_admm"])
def test_a_silo_deployment_equals_its_simulation_and_the_server_reads_no_data(tmp_path, algorithm):
    files = silo_files(tmp_path / "all")
    simulated = start(silo_config(tmp_path / "all", algorithm), tmp_path / "simulated", progress=False)
    hosts, node_data = silo_nodes(tmp_path, files)
    config = silo_config(tmp_path / "absent-on-the-server", algorithm)
    grid = InProcessGrid(config, hosts, tmp_path / "nodes", node_data=node_data)
    deployed = run_deployed(grid, ServerSettings(config, tmp_path / "deployed", False, 5.0))
    assert rows(deployed) == rows(simulated)
    assert {r["eval_on"] for r in rows(deployed)} == {"clients"}
    assert json.loads(deployed.info.read_text())["client_sizes"] == [9, 20, 14, 31]
    # one train message a node a round, carrying the node's clients (node 1: clients 0 and 1)
    trains = [m for m in grid.requests if m.metadata.message_type == protocol.TRAIN]
    assert len(trains) == 3 * 3
    carried = {m.metadata.dst_node_id: protocol.read_request(m.content).clients for m in trains}
    assert carried == {1: (0, 1), 2: (2,), 3: (3,)}
    population = protocol.read_request(trains[0].content).population
    assert population == (4, 9 + 20 + 14 + 31, 9 + 20 + 14 + 31, 3)  # clients, samples, weights, classes


def test_local_training_state_buffers_best_model_and_early_stop_deploy_as_simulated(tmp_path):
    """Issue 44's local training on a silo deployment: Adam whose state each client keeps between
    rounds (on its node, staged until the server accepts), a BatchNorm model whose statistics are
    averaged, the best model kept and early stopping, all as the simulation of the same files."""
    files = silo_files(tmp_path / "all")
    shape = {"features": 6, "classes": 3}
    bn_mlp = {"kind": "factory", "factory": "tests.test_buffers:bn_mlp", "kwargs": shape}
    local = {"optimizer": "adam", "lr": 0.02, "optimizer_state": "keep", "steps": 2, "batch_size": 8}
    overrides = {
        "rounds": 6,
        "algorithm__fraction": 0.5,
        "algorithm__local": local,
        "model": bn_mlp,
        "checkpoint": {"every": 2, "best": "accuracy"},
        "stop": {"metric": "loss", "patience": 2, "min_delta": 0.1},
    }
    simulated = start(silo_config(tmp_path / "all", "fedavg", **overrides), tmp_path / "sim", progress=False)
    hosts, node_data = silo_nodes(tmp_path, files)
    config = silo_config(tmp_path / "absent-on-the-server", "fedavg", **overrides)
    grid = InProcessGrid(config, hosts, tmp_path / "nodes", node_data=node_data)
    deployed = run_deployed(grid, ServerSettings(config, tmp_path / "deployed", False, 5.0))
    assert rows(deployed) == rows(simulated)
    stopped = json.loads(simulated.info.read_text())["stopped"]
    assert stopped["round"] < 6 and json.loads(deployed.info.read_text())["stopped"] == stopped
    best = [json.loads((run.path / "best" / "best.json").read_text()) for run in (deployed, simulated)]
    assert best[0] == best[1] and best[0]["value"] == max(r["accuracy"] for r in rows(simulated))
    # the optimizer's moments are client state on the nodes: a client picked twice resumed from them
    kept = list((tmp_path / "nodes").rglob("client-*.round-*.safetensors"))
    assert any(key.startswith("optimizer/") for f in kept for key in decode(f.read_bytes()).tensors())


class UntouchedGrid:
    """A Grid that fails any use: what is refused from the config never reaches the nodes."""

    def __getattr__(self, name):
        raise AssertionError(f"the grid was used ({name}) before the config was refused")


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        ({"compression": {"up": ["fp16"]}}, r"\[compression\].*simulation only"),
        (
            {"model": {"kind": "factory", "factory": "tests.test_buffers:bn_mlp", "buffers": "local"}},
            r"\[model.buffers\] 'local' is not supported by deployed runs",
        ),
        (
            {"secagg": {"enabled": True}},
            r"\[secagg\] with per-client data and no data.test: federated evaluation",
        ),
    ],
)
def test_what_a_deployment_cannot_do_is_refused_before_the_nodes_are_asked(tmp_path, overrides, refusal):
    config = silo_config(tmp_path / "absent", "fedavg", **overrides)
    with pytest.raises(ConfigError, match=refusal):
        run_deployed(UntouchedGrid(), ServerSettings(config, tmp_path / "run", False, 5.0))
    assert not (tmp_path / "run").exists()
    # a partitioned run's client-side evaluation, too (per-client data refuses it in any run)
    config = tiny_config(eval={"every": 1, "clients": 0.5})
    with pytest.raises(ConfigError, match=r"\[eval.clients\] deployed runs keep each client's data"):
        run_deployed(UntouchedGrid(), ServerSettings(config, tmp_path / "run", False, 5.0))


def test_the_census_stops_a_silo_run_before_round_1_and_names_each_problem(tmp_path, monkeypatch):
    files = silo_files(tmp_path / "all")
    hosts, node_data = silo_nodes(tmp_path, files)
    config = silo_config(tmp_path / "absent")
    settings = ServerSettings(config, tmp_path / "run", False, 5.0)

    def census_error(hosts, node_data) -> str:
        with pytest.raises(DeployError) as failed:
            run_deployed(InProcessGrid(config, hosts, tmp_path / "nodes", node_data=node_data), settings)
        assert not settings.out.exists() or not (settings.out / "metrics.jsonl").exists()
        return str(failed.value)

    lost = node_data | {3: {"data.path": str(tmp_path / "lost.npz")}}
    assert "node 3: its ClientApp failed" in census_error(hosts, lost)
    assert "lost.npz does not exist" in census_error(hosts, lost)
    twice = [[0, 1], [2], [2]]
    assert "client 2 is on node 2 and node 3" in census_error(twice, node_data | {3: node_data[2]})
    gap = [[0, 1], [3]]  # client 2's node is not there
    assert "[2] are on none" in census_error(gap, {1: node_data[1], 2: node_data[3]})
    monkeypatch.setattr("taciturn.deploy.client_app.__version__", "9.9.9")  # what the nodes say they run
    differ = "taciturn versions differ: 9.9.9 on the node, 0.1.0 on the server"
    assert differ in census_error(hosts, node_data)


def test_a_node_refuses_a_server_of_another_version(tmp_path, monkeypatch):
    import taciturn

    files = silo_files(tmp_path / "all")
    hosts, node_data = silo_nodes(tmp_path, files)
    config = silo_config(tmp_path / "absent")
    monkeypatch.setattr(taciturn, "__version__", "2.0.0")  # the node's installed taciturn
    with pytest.raises(DeployError, match=r"taciturn versions differ: 2\.0\.0 here, 0\.1\.0 on the server"):
        run_deployed(
            InProcessGrid(config, hosts, tmp_path / "nodes", node_data=node_data),
            ServerSettings(config, tmp_path / "run", False, 5.0),
        )


def test_the_floor_ends_a_run_that_trains_on_too_few(tmp_path):
    """Node 2 (clients 3, 4, 5) is down from round 2: 5 of 8 clients train. With min-trained 6 the
    rounds fall short; after patience 2 the run fails naming the rounds and the missing node."""
    config = tiny_config(rounds=6, algorithm=ALGORITHMS["fedavg"] | {"fraction": 1.0})
    grid = InProcessGrid(config, HOSTS, tmp_path / "nodes", unavailable={2: 1})
    floor = ServerSettings(config, tmp_path / "run", False, 5.0, min_trained=6, patience=2)
    with pytest.raises(DeployError) as failed:
        run_deployed(grid, floor)
    message = str(failed.value)
    assert "fewer than min-trained = 6 clients trained in 2 rounds in a row" in message
    assert "round 1: 5 of 8 trained (clients [3, 4, 5] on no node; node 2 is left out: it left" in message
    assert "round 2: 5 of 8 trained" in message
    assert [row["round"] for row in RunDir(floor.out).read_metrics()] == [0, 1]  # round 2 never written
    # the same rounds with a floor they meet (or patience they do not exhaust) run to the end
    lenient = dataclasses.replace(floor, out=tmp_path / "lenient", min_trained=5)
    grid = InProcessGrid(config, HOSTS, tmp_path / "nodes2", unavailable={2: 1})
    assert [r["round"] for r in run_deployed(grid, lenient).read_metrics()] == list(range(7))
    with pytest.raises(DeployError, match="could never be met"):
        too_high = dataclasses.replace(floor, out=tmp_path / "high", min_trained=9)
        run_deployed(InProcessGrid(config, HOSTS, tmp_path / "nodes3"), too_high)


def test_warnings_name_a_node_by_its_own_id_not_the_superlinks(tmp_path, caplog):
    """The SuperLink answers for a node it cannot reach with an error from its own node id (1):
    the warning names the node the message was for."""
    config = tiny_config(rounds=2, algorithm=ALGORITHMS["fedavg"] | {"fraction": 1.0})
    grid = InProcessGrid(config, HOSTS, tmp_path / "nodes", unavailable={3: 2})
    run_deployed(grid, ServerSettings(config, tmp_path / "run", False, 5.0))
    assert "round 2: node 3: it left the SuperLink; its clients [6, 7] are dropped" in caplog.text
    assert "node 1: it left" not in caplog.text


def test_a_private_deployment_names_no_picked_client_in_its_log(tmp_path, caplog):
    """[privacy]: who was picked is what sampling hides, so the warnings count the dropped clients
    (as the simulated pipeline's log does) and the events name none."""
    config = tiny_config(
        rounds=2,
        algorithm=ALGORITHMS["fedavg"] | {"fraction": 1.0},
        privacy={"enabled": True, "noise_multiplier": 1.0, "clip": 1.0},
    )
    grid = InProcessGrid(config, HOSTS, tmp_path / "nodes", unavailable={3: 2})
    rundir = run_deployed(grid, ServerSettings(config, tmp_path / "run", False, 5.0))
    assert "round 2: node 3: it left the SuperLink; its 2 picked clients are dropped" in caplog.text
    dropped = [line for line in rundir.log.read_text().splitlines() if "dropped" in line]
    assert dropped and not any("[6, 7]" in line for line in dropped)  # the hosts, said at discovery only
    part = RoundPart(accumulated=None, failed=[(3, "it raised")])  # the floor's reasons, too
    assert (
        _reasons(part, [6, 7], private=True)
        == "2 picked clients on no node; 1 failed, e.g. a client: it raised"
    )
    assert _reasons(part, [6, 7]) == "clients [6, 7] on no node; 1 failed, e.g. client 3: it raised"
    assert rundir.read_metrics()[-1]["train_loss"] is None
    # no client statistic left its node (the server drops one that arrives, so look at the bytes):
    # round 1's uplinks are as long as those the simulated clients release, which carry none
    simulated = start(config, tmp_path / "simulated", progress=False)

    def uplinks_of_round_1(run):
        return [
            {k: r[k] for k in ("client", *PAYLOAD)}
            for r in ledger(run)
            if (r["round"], r["direction"]) == ("1", "up") and r["messages_sent"] != "0"
        ]

    assert uplinks_of_round_1(rundir) == uplinks_of_round_1(simulated) != []


def test_the_docs_example_config_is_valid_and_checkpoints_before_round_10():
    """docs/deploy.md's silo.toml (its indented block under "A config, `silo.toml`:")."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    block = text.split("A config, `silo.toml`:\n\n", 1)[1].split("\n\nWrite the Flower app", 1)[0]
    import tomllib

    from taciturn.experiments.config import validate

    config = validate(tomllib.loads("\n".join(line[4:] for line in block.splitlines())), "docs/deploy.md")
    assert config.data.dataset == "clients" and config.checkpoint.every < 10 <= config.rounds


def test_the_wheel_the_docs_install_builds_and_carries_the_deploy_code(tmp_path):
    """`make wheel` (pip wheel of the project), built offline from a copy of the sources."""
    import shutil
    import subprocess
    import sys
    import zipfile

    import taciturn

    repo = Path(__file__).resolve().parents[1]
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, source / name)
    shutil.copytree(repo / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("taciturn-*.whl")
    assert wheel.name == f"taciturn-{taciturn.__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert {"taciturn/deploy/node.py", "taciturn/deploy/worker.py", "taciturn/data/clients.py"} <= set(names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Provides-Extra: flower" in metadata and 'flwr<2,>=1.42; extra == "flower"' in metadata

"""SecAgg+ on deployed rounds through Flower's own SecAggPlusWorkflow and secaggplus_mod: the server
gets the plain FedAvg aggregate to the quantisation error, and every stage's bytes are metered."""

import csv

import numpy as np
import pytest

pytest.importorskip("flwr")

from taciturn.algorithms import build_algorithm
from taciturn.core.errors import TaciturnError
from taciturn.deploy.inprocess import InProcessGrid
from taciturn.deploy.server_app import run_deployed
from taciturn.deploy.settings import DeployError, ServerSettings
from taciturn.experiments import checkpoint
from taciturn.experiments.config import to_toml
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config

ONE_EACH = [[0], [1], [2], [3]]  # four nodes, one client each
CLIP, BITS = 2.0, 24


def config(secagg: bool, **overrides):
    return tiny_config(
        rounds=1,
        partition={"kind": "dirichlet", "num_clients": 4, "alpha": 1.0, "min_size": 5},
        algorithm={"name": "fedavg", "fraction": 1.0, "local": {"batch_size": 16, "lr": 0.1}},
        secagg={"enabled": secagg, "clip": CLIP, "bits": BITS},
        **overrides,
    )


def deploy(cfg, tmp_path, name, hosts=ONE_EACH):
    grid = InProcessGrid(cfg, hosts, tmp_path / f"{name}-nodes")
    return run_deployed(grid, ServerSettings(cfg, tmp_path / name, False, 5.0)), grid


def model(rundir: RunDir, cfg) -> dict[str, np.ndarray]:
    _, folder = rundir.latest_checkpoint()
    state = checkpoint.load_server(folder, build_algorithm(cfg.algorithm))
    return {k: v.numpy() for k, v in state.params.items()}


def ledger(rundir: RunDir) -> dict[tuple[str, str], dict]:
    with rundir.ledger.open(newline="") as f:
        return {(r["client"], r["direction"]): r for r in csv.DictReader(f)}


def test_secagg_plus_gives_the_plain_fedavg_aggregate_to_the_quantisation_error(tmp_path):
    plain_cfg, secure_cfg = config(False), config(True)
    plain, _ = deploy(plain_cfg, tmp_path, "plain")
    secure, grid = deploy(secure_cfg, tmp_path, "secure")
    assert [r for r, _ in plain.committed_checkpoints()] == [1]  # the model after round 1
    p, s = model(plain, plain_cfg), model(secure, secure_cfg)
    # Flower's mod quantises n_k / max_n * x_k to L = 2^bits - 1 levels over [-c, c] with stochastic
    # rounding (error < one level, 2c / L) and the server divides the sum by sum_k n_k / max_n >= 1:
    # each coordinate of the mean is off by < 4 levels, plus the weights' own rounding (1 / L each)
    step = 2 * CLIP / (2**BITS - 1)
    diff = max(float(np.abs(p[k] - s[k]).max()) for k in p)
    assert diff < 4 * step + 1e-6, diff

    # the four stages crossed the wire: setup, share keys, masked vectors (the train step), unmask
    trains = [m for m in grid.requests if m.metadata.message_type == "train"]
    assert len(trains) == 4 * 4
    numel = sum(v.size for v in p.values())
    rows, plain_rows = ledger(secure), ledger(plain)
    for client in "0123":
        up, down = rows[(client, "up")], rows[(client, "down")]
        assert int(up["bytes_sent"]) == 8 * (1 + numel)  # the weight, then each coordinate, int64
        assert down["bytes_sent"] == plain_rows[(client, "down")]["bytes_sent"]  # the broadcast
        assert int(down["wire_bytes"]) > int(plain_rows[(client, "down")]["wire_bytes"])  # + key stages
        assert int(up["wire_bytes"]) > int(up["bytes_sent"])
    metrics = secure.read_metrics()[-1]
    assert metrics["delivered_up"] == 4


def test_secagg_plus_is_refused_where_it_cannot_serve(tmp_path):
    scaffold = to_toml(config(True)).replace('name = "fedavg"', 'name = "scaffold"')
    with pytest.raises(TaciturnError, match="sums model deltas"):  # its uplink carries c_i's change too
        ServerSettings.from_run_config({"taciturn-config": scaffold, "out": str(tmp_path / "run")})
    with pytest.raises(DeployError, match="each node hosts one client"):  # its node would see both
        deploy(config(True), tmp_path, "two-per-node", hosts=[[0, 1], [2, 3]])


def test_the_app_folder_of_a_secagg_run_starts_the_clientapp_with_flowers_mod(tmp_path):
    import tomllib

    from taciturn.deploy.app_folder import write_app

    for secagg, clientapp in ((True, "secagg_app"), (False, "app")):
        pyproject = write_app(tmp_path / str(secagg), config(secagg), tmp_path / "run")
        components = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["components"]
        assert components["clientapp"] == f"taciturn.deploy.client_app:{clientapp}"

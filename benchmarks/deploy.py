"""taciturn on Flower's deployment runtime with real processes on loopback (issues 17, 41).

* W2 as a silo federation: W2's model (784-200-200-10 MLP, Fashion-MNIST, 100 clients, 10 a
  round), FedAvg, its Dirichlet(0.5) partition written once as one .npz file per client (its
  training rows and a hundredth of the test set as its own held-out split). 10 SuperNodes (`taciturn
  deploy node`: a long-lived ClientApp each) hold 10 clients' files each; a SuperLink with TLS,
  SuperNode authentication and a database; the server holds no data at all (the run's data path
  does not exist on it) and evaluates by federated evaluation. The same per-client files
  simulated (sequential executor) are the baseline. Each round's time (from the run's log on the
  deployed side, from a round callback in simulation; round 1, the warm-up, left out), its 95%
  t-interval over rounds (benchmarks/protocol.py), and the deployed/simulated ratio paired by
  round (the same clients are picked in both); wire bytes against payload bytes; the deployed
  metrics against the simulation's.
* A small model on the same federation and files (logistic regression): the same round times and
  ratio, where Flower's own per-round costs dominate.
* A node stopped when its round-2 request arrives and restarted at once (SCAFFOLD, 10 nodes with
  one client each, 3 rounds): it is dropped in round 2 and in round 3 trains from the state it
  persisted in round 1 (``killed_node_caught_up``); a node with an unregistered key is refused
  (``unregistered_node_refused``).
* ``--pair``: the demo pair (benchmarks/configs/deploy_pair_*.toml, the demo until issue 43 made
  it the frontier's winner against the best baseline; 10 agents, one class each, MLP 200), FedAvg
  against event-based ADMM with fixed thresholds, 10 rounds, on the wire: what the silent triggers save once
  every message's frame counts. Its bytes come from the same serialization whether the messages
  cross a network or not, so this part runs in process (deploy/inprocess.py).

    python benchmarks/deploy.py --quick    # 3 rounds: a smoke run
    python benchmarks/deploy.py            # 12 rounds, real processes; results and docs
    python benchmarks/deploy.py --pair     # event-based ADMM's wire bytes against FedAvg's

CPU-heavy (10 node processes train at once): run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from protocol import markdown_table, replace_section, t_interval
from speed import workload_tree

from taciturn.deploy.inprocess import InProcessGrid
from taciturn.deploy.server_app import run_deployed
from taciturn.deploy.settings import ServerSettings
from taciturn.experiments import types
from taciturn.experiments.config import read_tree, validate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the test suite's process helpers
from tests.conftest import tiny_config
from tests.deploy_processes import Federation, Processes

RESULTS = Path(__file__).resolve().parent / "results"
NODES = 10
BOOT_S = 300
ROUND_TIMEOUT_S = 600.0


def traffic(ledger: Path) -> dict[str, int]:
    totals = {"payload_bytes": 0, "wire_bytes": 0, "payload_messages": 0}
    with ledger.open(newline="") as f:
        for row in csv.DictReader(f):
            totals["payload_bytes"] += int(row["bytes_sent"])
            totals["wire_bytes"] += int(row["wire_bytes"])
            totals["payload_messages"] += int(row["messages_sent"])
    return totals


def deploy_in_process(config, out: Path) -> Path:
    hosts = [[c] for c in range(config.partition.num_clients)]  # one client per node
    grid = InProcessGrid(config, hosts, out / "nodes")
    return run_deployed(grid, ServerSettings(config, out / "run", True, ROUND_TIMEOUT_S)).path


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def parity(a: Path, b: Path) -> float:
    diffs = [
        abs(x[k] - y[k])
        for x, y in zip(metrics(a), metrics(b), strict=True)
        for k in x
        if k != "wall_s" and isinstance(x[k], float) and isinstance(y[k], float)
    ]
    return max(diffs, default=0.0)


def logged_rounds(run: Path) -> list[float]:
    """Each round's duration (s) from the deployed run's log: the time between the executor's
    consecutive "round r: ... trained" lines, round 1 (the warm-up, and the census before it) left
    out. Both sides' round times include their checkpoints; evaluation is only at the end."""
    stamps = [
        datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for line in (run / "run.log").read_text().splitlines()
        if re.search(r"grid_executor: round \d+: \d+ of \d+ picked clients trained", line)
    ]
    return [b - a for a, b in itertools.pairwise(stamps)]


class RoundTimer:
    """A round callback (experiments/runner.py): each round's duration in simulation, round 1 left out."""

    def __init__(self):
        self.ends: list[float] = []

    def __call__(self, end) -> None:
        self.ends.append(time.perf_counter())

    def rounds(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.ends)]


def round_stats(deployed: list[float], simulated: list[float]) -> dict:
    """Mean round times with 95% t-intervals over rounds, and the ratio paired by round (the
    geometric mean of deployed/simulated, its interval from the log ratios)."""
    logs = np.log(np.asarray(deployed) / np.asarray(simulated))
    low, high = t_interval(logs)
    return {
        "round_s": {"deployed": float(np.mean(deployed)), "simulated": float(np.mean(simulated))},
        "round_s_ci": {"deployed": list(t_interval(deployed)), "simulated": list(t_interval(simulated))},
        "ratio": {"mean": float(np.exp(logs.mean())), "ci": [float(np.exp(low)), float(np.exp(high))]},
        "rounds_timed": len(logs),
    }


def write_clients(config, folder: Path) -> list[str]:
    """W2's partition as one .npz file per client: its training rows, and a hundredth of the test
    set as its held-out split (the federated evaluation then covers the whole test set). Node k
    holds clients 10k .. 10k + 9 (a folder each); ``all`` links every file, in client order, for the
    simulation. The node folders."""
    from taciturn.core.rng import Streams
    from taciturn.experiments.runner import build_task

    _, data = build_task(config, Streams(config.seed))
    ds, clients = data.dataset, data.num_clients
    tests = np.array_split(np.arange(len(ds.y_test)), clients)
    (folder / "all").mkdir(parents=True)
    nodes = []
    for node in range(NODES):
        home = folder / f"node-{node + 1}"
        home.mkdir()
        nodes.append(str(home))
    per_node = clients // NODES
    for client in range(clients):
        rows, held = data.client_indices(client), tests[client]
        path = Path(nodes[client // per_node]) / f"client-{client:03d}.npz"
        np.savez(
            path,
            x_train=ds.x_train[rows].numpy(),
            y_train=ds.y_train[rows].numpy(),
            x_test=ds.x_test[held].numpy(),
            y_test=ds.y_test[held].numpy(),
        )
        os.link(path, folder / "all" / path.name)
    return nodes


def pair_config(name: str, rounds: int):
    """One of the pair's configs (benchmarks/configs/deploy_pair_*.toml) for ``rounds`` rounds."""
    path = Path(__file__).resolve().parent / "configs" / name
    tree = read_tree(path)
    tree["rounds"], tree["eval"], tree["engine"] = rounds, {"every": rounds}, {"executor": "sequential"}
    return validate(tree, str(path))


def killed_node_caught_up(federation: Federation) -> bool:
    """SCAFFOLD over NODES nodes of one client each: node NODES is stopped at its round-2 request
    and restarted; it must be dropped in round 2 and train round 3 from its round-1 state."""
    client = NODES - 1
    config = tiny_config(
        name="deploy-kill",
        rounds=3,
        partition={"kind": "dirichlet", "num_clients": NODES, "alpha": 1.0, "min_size": 5},
        algorithm={"name": "scaffold", "fraction": 1.0, "local": {"batch_size": 16, "lr": 0.1}},
    )
    run, folder, held = federation.kill_and_restart(
        NODES, 2, lambda: federation.submit(config, round_timeout=ROUND_TIMEOUT_S)
    )
    federation.finish(run, BOOT_S * 3)
    round_1 = f"client-{client}.round-1.safetensors"  # its state after round 1 (node_state.py)
    round_3 = f"client-{client}.round-3.safetensors"
    delivered = [r["delivered_up"] for r in run.read_metrics()]
    dropped_then_back = [b - a for a, b in itertools.pairwise(delivered)] == [NODES, NODES - 1, NODES]
    return (
        dropped_then_back
        and round_1 in held
        and sorted(p.name for p in folder.glob("*.safetensors")) == [round_1, round_3]
        and (folder / round_1).read_bytes() == held[round_1]
    )


def pair_bytes(rounds: int) -> None:
    """FedAvg against event-based ADMM on the demo pair: payload and wire bytes, in process."""
    pair = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("deploy_pair_fedavg.toml", "deploy_pair_event_admm.toml"):
            config = pair_config(name, rounds)
            ledger = deploy_in_process(config, Path(tmp) / config.algorithm.name) / "ledger.csv"
            pair[config.algorithm.name] = traffic(ledger)
    saving = 1 - pair["event_admm"]["wire_bytes"] / pair["fedavg"]["wire_bytes"]
    rows = [[label, r["payload_messages"], r["payload_bytes"], r["wire_bytes"]] for label, r in pair.items()]
    table = markdown_table(["demo pair", "messages with a model", "payload bytes", "wire bytes"], rows)
    print(table)
    print(f"event-based ADMM's wire bytes against FedAvg's ({rounds} rounds): -{100 * saving:.1f}%")
    command = "python benchmarks/deploy.py --pair"
    summary = {"command": command, "rounds": rounds, "runs": pair, "event_admm_wire_saving_vs_fedavg": saving}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "deploy_pair.json").write_text(json.dumps(summary, indent=1))
    body = (
        f"Command: `{command}` (results: `benchmarks/results/deploy_pair.json`), one seed, in process "
        "(Flower's messages and serialization; the wire bytes are the same on a network). The demo "
        f"pair, {rounds} rounds, 10 agents, one class each.\n\n"
        + table
        + f"\n\nEvent-based ADMM's wire bytes are {100 * saving:.1f}% below FedAvg's (one seed: a "
        "measurement of bytes, not a claim about accuracy)."
    )
    replace_section("deploy-pair", body, "Deployed event-based ADMM against FedAvg: wire bytes (issue 17)")


def simulate(tree: dict, root: Path, name: str) -> tuple[Path, list[float]]:
    """``tree`` over the per-client files of ``root / "all"``, simulated; its run directory and
    its round times (a round callback; round 1 left out)."""
    timer = RoundTimer()
    config = validate(tree | {"name": name, "data": {"dataset": "clients", "path": str(root / "all")}}, name)
    run = types.start(config, root / f"{name}-sim", report=False, progress=False, callbacks=(timer,))
    return run.path, timer.rounds()


def deploy(federation: Federation, tree: dict, root: Path, name: str) -> tuple[Path, list[float]]:
    """``tree`` deployed on ``federation``, its data path absent on the server; its run directory
    and its round times (the run's log)."""
    config = validate(tree | {"name": name, "data": {"dataset": "clients", "path": str(root / "none")}}, name)
    run = federation.finish(federation.submit(config, ROUND_TIMEOUT_S), BOOT_S * config.rounds).path
    return run, logged_rounds(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds: a smoke run (results/deploy_quick.json)"
    )
    parser.add_argument("--pair", action="store_true", help="only the demo pair's wire bytes, in process")
    parser.add_argument(
        "--rounds", type=int, default=12, help="rounds of each timed run (>= 10 for the record)"
    )
    args = parser.parse_args()
    if args.pair:
        return pair_bytes(10)
    rounds = 3 if args.quick else args.rounds
    w2_tree = workload_tree("W2", quick=True) | {"rounds": rounds, "engine": {"executor": "sequential"}}
    w2_tree |= {"eval": {"every": rounds, "batch_size": 1000}, "checkpoint": {"every": 1000}}
    small_tree = w2_tree | {"model": {"kind": "logreg"}}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        load_before = os.getloadavg()
        node_folders = write_clients(validate(w2_tree, "W2"), root)
        for tree in (w2_tree, small_tree):
            tree.pop("partition", None)  # per-client data comes split
        # the simulations first, on a machine without the federation's processes
        simulated, w2_simulated = simulate(w2_tree, root, "w2")
        small_simulated, small_sim_rounds = simulate(small_tree, root, "small")
        # the small model again on one thread, as each node trains: the same numbers as deployed, bit
        # for bit where the transport adds nothing (more threads sum in another order: ~1e-4 by round 3)
        single, _ = simulate(
            small_tree | {"engine": {"executor": "sequential", "threads": 1}}, root, "single"
        )
        per_node = 100 // NODES
        hosts = [",".join(str(c) for c in range(i * per_node, (i + 1) * per_node)) for i in range(NODES)]
        processes = Processes(root / "federation")
        try:
            data = [f'data.path="{folder}"' for folder in node_folders]
            federation = Federation(root / "federation", processes, hosts, BOOT_S, node_data=data)
            federation.strangers()
            deployed, w2_deployed = deploy(federation, w2_tree, root, "w2")
            small_deployed, small_dep_rounds = deploy(federation, small_tree, root, "small")
            w2_rounds = round_stats(w2_deployed, w2_simulated)
            small_rounds = round_stats(small_dep_rounds, small_sim_rounds)
            w2_traffic = traffic(deployed / "ledger.csv")
            result = {
                "nodes": NODES,
                "rounds": rounds,
                "tls": True,
                "node_auth": True,
                "node_local_data": True,
                "server_has_training_data": False,
                "federated_eval": all(r.get("eval_on") == "clients" for r in metrics(deployed)),
                "parity_max_abs_diff": parity(deployed, simulated),
                "wire_bytes": w2_traffic["wire_bytes"],
                "payload_bytes": w2_traffic["payload_bytes"],
                **{k: w2_rounds[k] for k in ("round_s", "round_s_ci")},
                "round_ratio": w2_rounds["ratio"],
                "small_model": {
                    **small_rounds,
                    "parity_max_abs_diff": parity(small_deployed, small_simulated),
                    "parity_max_abs_diff_one_thread": parity(small_deployed, single),
                },
            }
            unregistered_refused = federation.refused("stranger", "Failed to activate SuperNode")
            no_ca_refused = federation.refused("no-ca", "CERTIFICATE_VERIFY_FAILED")
            for key in range(1, NODES + 1):  # the same nodes, now one client each of a shared dataset
                processes.stop(f"node-{key}")
            federation.hosts, federation.node_data = [str(c) for c in range(NODES)], [""] * NODES
            for key in range(1, NODES + 1):
                federation.node(f"node-{key}", key, *federation.with_ca)
            result["killed_node_caught_up"] = killed_node_caught_up(federation)
            result["unregistered_node_refused"] = unregistered_refused
            load_after = os.getloadavg()
        finally:
            processes.close()
    minutes = (time.monotonic() - started) / 60
    framing = result["wire_bytes"] / result["payload_bytes"] - 1
    report(result, args, w2_traffic, framing, no_ca_refused, load_before, load_after, minutes)


def interval(ci: list[float], digits: int = 2) -> str:
    return f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def report(result, args, w2_traffic, framing, no_ca_refused, load_before, load_after, minutes) -> None:
    rounds, small = result["rounds"], result["small_model"]
    rows = [
        [
            f"W2 FedAvg, {NODES} SuperNodes (TLS, node auth)",
            w2_traffic["payload_messages"],
            result["payload_bytes"],
            result["wire_bytes"],
            f"{100 * framing:.3f}%",
        ],
    ]
    table = markdown_table(["run", "messages with a model", "payload bytes", "wire bytes", "framing"], rows)
    w2, ratio = result["round_s_ci"], result["round_ratio"]
    times = markdown_table(
        [
            "model",
            "deployed s / round (95% CI)",
            "simulated s / round (95% CI)",
            "deployed / simulated (95% CI)",
        ],
        [
            [
                "W2 (784-200-200-10 MLP)",
                f"{result['round_s']['deployed']:.2f} {interval(w2['deployed'])}",
                f"{result['round_s']['simulated']:.2f} {interval(w2['simulated'])}",
                f"{ratio['mean']:.2f}x {interval(ratio['ci'])}",
            ],
            [
                "small (logistic regression)",
                f"{small['round_s']['deployed']:.2f} {interval(small['round_s_ci']['deployed'])}",
                f"{small['round_s']['simulated']:.3f} {interval(small['round_s_ci']['simulated'], 3)}",
                f"{small['ratio']['mean']:.0f}x {interval(small['ratio']['ci'], 0)}",
            ],
        ],
    )
    print(table, "\n")
    print(times, "\n")
    print(json.dumps(result, indent=1))
    print(f"a node without the CA refused: {no_ca_refused}; {minutes:.1f} min")
    command = "python benchmarks/deploy.py" + (" --quick" if args.quick else f" --rounds {rounds}")
    RESULTS.mkdir(exist_ok=True)
    name = "deploy_quick.json" if args.quick else "deploy.json"
    (RESULTS / name).write_text(json.dumps(result, indent=1))
    details = {
        "command": command,
        "minutes": minutes,
        "framing_overhead": framing,
        "no_ca_node_refused": no_ca_refused,
        "load_average_before_after": [load_before, load_after],
        "w2_traffic": w2_traffic,
    }
    (RESULTS / name.replace(".json", "_details.json")).write_text(json.dumps(details, indent=1))
    if args.quick:
        return
    body = (
        f"Command: `{command}` ({minutes:.0f} min; results: `benchmarks/results/{name}`, details in "
        "`benchmarks/results/deploy_details.json`), one seed, on this project's shared 2-core machine. "
        f"W2's model, FedAvg, {rounds} rounds, 10 clients a round, as a silo federation: W2's partition "
        f"written as one file per client, {NODES} SuperNodes (`taciturn deploy node`, a long-lived "
        "ClientApp each, one message a node a round) holding 10 clients' files each, a SuperLink with "
        "TLS, SuperNode authentication and a database on loopback, the server with no data at all and "
        "federated evaluation; the baseline simulates the same per-client files. Round times: round 1 "
        "left out, 95% t-intervals over the other rounds, the ratio paired by round. Wire bytes are every "
        "serialized Flower message, payload bytes taciturn's safetensors messages as in simulation; "
        "gRPC/HTTP2/TLS framing comes on top.\n\n"
        + table
        + "\n\n"
        + times
        + "\n\nA deployed round costs at least Flower 1.42's idle SuperNode poll (3 s: a node that "
        "answered asks the SuperLink for the next message 3 s later) plus the slowest node's training; "
        "the small model's round is that floor. Deployed against simulated metrics: max absolute "
        f"difference {result['parity_max_abs_diff']:.3g} (W2), {small['parity_max_abs_diff']:.3g} (small), "
        f"{small['parity_max_abs_diff_one_thread']:.3g} against the small model simulated on one thread as "
        "each node trains (more threads sum in another order; the transport adds nothing). The "
        "simulations ran first, before any federation process started. "
        f"A node stopped at its round-2 request and restarted caught up with its persisted state: "
        f"{result['killed_node_caught_up']}; a node with an unregistered key was refused: "
        f"{result['unregistered_node_refused']}; one without the CA: {no_ca_refused}. "
        f"Load average (1/5/15 min) before: {load_before[0]:.1f}/{load_before[1]:.1f}/"
        f"{load_before[2]:.1f}, after: {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} (the "
        "machine is shared: round times are what this load gave, one run)."
    )
    replace_section("deploy", body, "taciturn on Flower's deployment runtime (issues 17, 41)")


if __name__ == "__main__":
    main()

"""taciturn on Flower's deployment runtime: the bytes on the wire against the payload (issue 17).

Each run goes through the deployed code path (ServerApp round loop, Grid executor, ClientApp,
node-side state) with Flower's own messages and serialization, delivered in this process
(deploy/inprocess.py) instead of through a SuperLink, so the framing Flower adds to taciturn's
payloads is measured exactly; HTTP/TLS framing on a real network comes on top and is not counted.

* W2's model (784-200-200-10 MLP, Fashion-MNIST, 100 clients, 10 per round; one client per node),
  FedAvg: wire bytes against payload bytes, and the deployed metrics against the simulation's.
* The demo's pair (10 agents, one class each, MLP 200): FedAvg against event-based ADMM with the
  demo's thresholds, on the wire: what the silent triggers save once every message's frame counts.

Not measured here: round time with real processes (SuperLink and SuperNodes on loopback), which
needs a machine with cores to spare; tests/test_deploy_e2e.py runs that path for correctness.

    python benchmarks/deploy.py --quick    # 2 rounds each: a smoke run
    python benchmarks/deploy.py            # W2 3 rounds, demo pair 10 rounds; results and docs
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tempfile
from importlib import resources
from pathlib import Path

from docs_section import markdown_table, replace_section
from speed import workload_tree

from taciturn.deploy.inprocess import InProcessGrid
from taciturn.deploy.server_app import run_deployed
from taciturn.deploy.settings import ServerSettings
from taciturn.experiments import types
from taciturn.experiments.config import read_tree, validate

RESULTS = Path(__file__).resolve().parent / "results"


def traffic(ledger: Path) -> dict[str, int]:
    totals = {"payload_bytes": 0, "wire_bytes": 0, "payload_messages": 0}
    with ledger.open(newline="") as f:
        for row in csv.DictReader(f):
            totals["payload_bytes"] += int(row["bytes_sent"])
            totals["wire_bytes"] += int(row["wire_bytes"])
            totals["payload_messages"] += int(row["messages_sent"])
    return totals


def deploy(config, out: Path) -> Path:
    hosts = [[c] for c in range(config.partition.num_clients)]  # one client per node
    grid = InProcessGrid(config, hosts, out / "nodes")
    return run_deployed(grid, ServerSettings(config, out / "run", True, 600.0)).path


def parity(a: Path, b: Path) -> float:
    rows = [[json.loads(line) for line in (p / "metrics.jsonl").read_text().splitlines()] for p in (a, b)]
    diffs = [
        abs(x[k] - y[k])
        for x, y in zip(*rows, strict=True)
        for k in x
        if k != "wall_s" and isinstance(x[k], float) and isinstance(y[k], float)
    ]
    return max(diffs, default=0.0)


def demo_config(name: str, rounds: int):
    path = Path(str(resources.files("taciturn.experiments") / "configs" / name))
    tree = read_tree(path)
    tree["rounds"], tree["eval"], tree["engine"] = rounds, {"every": rounds}, {"executor": "sequential"}
    return validate(tree, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds each: a smoke run (results/deploy_quick.json)"
    )
    args = parser.parse_args()
    w2_rounds, pair_rounds = (2, 2) if args.quick else (3, 10)
    tree = workload_tree("W2", quick=True) | {"rounds": w2_rounds, "engine": {"executor": "sequential"}}
    tree["eval"] = {"every": w2_rounds, "batch_size": 1000}
    w2 = validate(tree, "W2")
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        deployed = deploy(w2, root / "w2")
        simulated = types.start(w2, root / "w2-sim" / "run", report=False, progress=False).path
        w2_traffic = traffic(deployed / "ledger.csv")
        results["w2_fedavg"] = w2_traffic | {"parity_max_abs_diff": parity(deployed, simulated)}
        for name in ("demo.toml", "demo_event_admm.toml"):
            config = demo_config(name, pair_rounds)
            results[config.algorithm.name] = traffic(
                deploy(config, root / config.algorithm.name) / "ledger.csv"
            )
    for label, r in results.items():
        overhead = r["wire_bytes"] / r["payload_bytes"] - 1 if r["payload_bytes"] else math.nan
        r["framing_overhead"] = overhead
        rows.append(
            [label, r["payload_messages"], r["payload_bytes"], r["wire_bytes"], f"{100 * overhead:.3f}%"]
        )
    saving = 1 - results["event_admm"]["wire_bytes"] / results["fedavg"]["wire_bytes"]
    table = markdown_table(["run", "messages with a model", "payload bytes", "wire bytes", "framing"], rows)
    print(table)
    print(f"event-based ADMM's wire bytes against FedAvg's ({pair_rounds} rounds): -{100 * saving:.1f}%")
    print(
        f"W2 deployed vs simulated metrics, max abs difference: {results['w2_fedavg']['parity_max_abs_diff']}"
    )
    command = "python benchmarks/deploy.py" + (" --quick" if args.quick else "")
    summary = {
        "command": command,
        "transport": "in-process Flower messages (Flower's serialization, no network)",
        "nodes": w2.partition.num_clients,
        "rounds": w2_rounds,
        "tls": None,  # not measured: no network in this benchmark
        "node_auth": None,
        "parity_max_abs_diff": results["w2_fedavg"]["parity_max_abs_diff"],
        "wire_bytes": results["w2_fedavg"]["wire_bytes"],
        "payload_bytes": results["w2_fedavg"]["payload_bytes"],
        "round_s": {"deployed": None, "simulated": None},  # needs real processes on an idle machine
        "event_admm_wire_saving_vs_fedavg": saving,
        "runs": results,
    }
    RESULTS.mkdir(exist_ok=True)
    name = "deploy_quick.json" if args.quick else "deploy.json"
    (RESULTS / name).write_text(json.dumps(summary, indent=1))
    body = (
        ("**Smoke run** (2 rounds each, one seed): bytes only, no claim. " if args.quick else "")
        + f"Command: `{command}` (results: `benchmarks/results/{name}`). Deployed code path with "
        "Flower's messages and serialization, delivered in process: wire bytes are every serialized "
        "Flower message (requests and replies with no model included), payload bytes are taciturn's "
        f"safetensors messages as in simulation. W2's model, FedAvg, {w2_rounds} rounds, 10 clients a "
        f"round, one client per node; the demo pair, {pair_rounds} rounds, 10 agents.\n\n"
        + table
        + f"\n\nEvent-based ADMM's wire bytes are {100 * saving:.1f}% below FedAvg's on the demo pair "
        f"({pair_rounds} rounds, one seed: a measurement of bytes, not a claim about accuracy). "
        f"W2 deployed against simulated metrics: max absolute difference "
        f"{results['w2_fedavg']['parity_max_abs_diff']:.3g}. Round times with real processes are "
        "not measured (see docs/deploy.md; tests/test_deploy_e2e.py checks that path)."
    )
    replace_section(
        "deploy", body, "taciturn on Flower's deployment runtime: wire against payload (issue 17)"
    )


if __name__ == "__main__":
    main()

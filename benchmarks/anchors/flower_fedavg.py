"""Flower 1.x FedAvg on the plan: Message API (ServerApp + ClientApp) in Flower's simulation runtime.

`flwr.simulation.run_simulation` with the Ray backend and one virtual SuperNode per client of the
plan. The strategy is Flower's own `serverapp.strategy.FedAvg`, subclassed only so that round r
sends the global model to the nodes of the plan's clients (`plan.round_clients[r]`, not a random
sample) with (round, slot) in the ConfigRecord, and aggregates the replies in slot order (Flower
adds them in arrival order, which makes the float sums, and so the accuracy, vary from run to run).
Each ClientApp runs `workload.local_sgd` on `plan.client_data(round, slot)` from the weights it
receives and replies with its weights and "num-examples"; aggregation is Flower's
`aggregate_arrayrecords` (weighted by "num-examples"). The global model is evaluated centrally
(`evaluate_fn`) after the rounds where `plan.evaluate_now`; federated evaluation is off.

Settings, the fastest of the reference measurements on 2 cores (Flower 1.42, Ray 2.55):
`client_resources={"num_cpus": 1}` on a 2-CPU Ray cluster = 2 actors x 1 torch thread (1 actor x
2 threads was 10-15 % slower); the ServerApp thread (aggregation, evaluation) uses 2 torch threads.
Telemetry of Flower and Ray is off (no network here).

usage: python flower_fedavg.py PLAN_DIR OUT.json     (in benchmarks/.venv-flower; see `make bench-env`)
"""

from __future__ import annotations

import os
import sys
import time
from functools import lru_cache

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # read when flwr is imported
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from flwr.simulation import run_simulation
from workload import Plan, evaluate, local_sgd, write_result

CPUS = 2  # Ray cluster size = the 2 cores every implementation gets
CLIENT_CPUS = 1  # per ClientApp actor: 2 actors x 1 torch thread
SERVER_THREADS = 2


@lru_cache(maxsize=1)
def load_plan(folder: str) -> Plan:
    """Once per process (driver and each Ray actor)."""
    return Plan(folder)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    torch.set_num_threads(CLIENT_CPUS)
    plan = load_plan(str(config["plan"]))
    model = plan.model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = plan.client_data(int(config["round"]), int(config["slot"]))
    local_sgd(model, x, y, plan.batch_size, plan.lr)
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": len(x)})}
    )
    return Message(content=content, reply_to=msg)


class PlannedFedAvg(FedAvg):
    """Flower's FedAvg with the plan's clients in each round instead of a random sample."""

    def __init__(self, plan: Plan, folder: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.plan, self.folder, self.slot_of = plan, folder, {}

    def configure_train(self, server_round, arrays, config, grid):
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)  # Flower's wait for all nodes
        nodes = sorted(nodes)  # the i-th node id stands for client i of the plan
        messages, self.slot_of = [], {}
        for slot, client in enumerate(self.plan.round_clients[server_round - 1]):
            node = nodes[int(client)]
            self.slot_of[node] = slot
            cfg = ConfigRecord({"plan": self.folder, "round": server_round - 1, "slot": slot})
            content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: cfg})
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def aggregate_train(self, server_round, replies):
        replies = sorted(replies, key=lambda m: self.slot_of[m.metadata.src_node_id])
        return super().aggregate_train(server_round, replies)


server_app = ServerApp()
RESULT: dict = {}  # filled by the ServerApp thread (same process)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    torch.set_num_threads(SERVER_THREADS)
    folder = RESULT["plan"]
    plan = load_plan(folder)
    model = plan.model()
    evals = []

    def central_evaluation(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0 or not plan.evaluate_now(server_round):
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        evals.append({"round": server_round, **evaluate(model)})
        return MetricRecord({k: v for k, v in evals[-1].items() if k != "round"})

    num_clients = plan.meta["num_clients"]
    strategy = PlannedFedAvg(
        plan,
        folder,
        fraction_train=plan.per_round / num_clients,
        fraction_evaluate=0.0,
        min_available_nodes=num_clients,
    )
    started = time.perf_counter()
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=plan.rounds,
        evaluate_fn=central_evaluation,
    )
    RESULT.update(evals=evals, strategy_s=time.perf_counter() - started)


def run(plan_dir: str, out: str) -> None:
    RESULT["plan"] = os.path.abspath(plan_dir)
    num_clients = load_plan(RESULT["plan"]).meta["num_clients"]
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=num_clients,
        backend_config={
            "client_resources": {"num_cpus": CLIENT_CPUS, "num_gpus": 0.0},
            "init_args": {"num_cpus": CPUS, "include_dashboard": False, "logging_level": "ERROR"},
        },
    )
    evals = RESULT["evals"]
    write_result(
        out,
        {
            "impl": "flower",
            "accuracy": evals[-1]["accuracy"],
            "evals": evals,
            "strategy_s": RESULT["strategy_s"],
            "settings": {"supernodes": num_clients, "actors": CPUS // CLIENT_CPUS, "client_threads": 1},
        },
    )


if __name__ == "__main__":
    # Ray pickles the ClientApp with every message: taken from an importable module (not __main__),
    # its functions travel by reference, and each actor imports this module once and keeps its caches.
    import flower_fedavg

    flower_fedavg.run(*sys.argv[1:3])

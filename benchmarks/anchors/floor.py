"""The floor: one model, one plain SGD loop over exactly the planned mini-batches (same count,
sizes and order as the federated runs), no copies, no averaging, the same evaluations. It does
the same per-sample gradient work as FedAvg and nothing else, so no FedAvg can be faster except
by computing differently (several processes, batching across clients).

usage: python floor.py PLAN_DIR OUT.json [--threads 2]
"""

from __future__ import annotations

import argparse

import torch
from workload import Plan, evaluate, local_sgd, write_result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("plan")
    parser.add_argument("out")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plan = Plan(args.plan)
    model = plan.model()
    evals = []
    for r in range(plan.rounds):
        for slot in range(plan.per_round):
            local_sgd(model, *plan.client_data(r, slot), plan.batch_size, plan.lr)
        if plan.evaluate_now(r + 1):
            evals.append({"round": r + 1, **evaluate(model)})
    write_result(args.out, {"impl": "floor", "accuracy": evals[-1]["accuracy"], "evals": evals})


if __name__ == "__main__":
    main()

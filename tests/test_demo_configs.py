"""The demo compares like with like: the same workload and the same rounds for both runs, and it
keeps one checkpoint per run (issue 19: equal round budgets, at most 100 MB on disk)."""

from taciturn.cli import DEMO_CONFIGS, _demo_config
from taciturn.experiments import types


def test_demo_runs_share_workload_and_round_budget_and_keep_one_checkpoint():
    fedavg, event = (types.load(_demo_config(name)) for name in DEMO_CONFIGS)
    assert (fedavg.algorithm.name, event.algorithm.name) == ("fedavg", "event_admm")
    assert fedavg.rounds == event.rounds
    for part in ("data", "partition", "model", "eval", "seed"):
        assert getattr(fedavg, part) == getattr(event, part), part
    assert fedavg.checkpoint.keep == event.checkpoint.keep == 1
    local_f, local_e = fedavg.algorithm.local, event.algorithm.local
    assert (local_f.epochs, local_f.batch_size, local_f.lr, local_f.momentum) == (
        local_e.epochs,
        local_e.batch_size,
        local_e.lr,
        local_e.momentum,
    )

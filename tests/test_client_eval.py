"""Client-side evaluation (issue 44): the global model on sampled clients' own held-out splits."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taciturn
from taciturn.core.rng import Streams
from taciturn.deploy.settings import refuse_undeployable
from taciturn.experiments import types
from taciturn.experiments.config import ConfigError, load_config
from taciturn.experiments.runner import build_task, prepare, resume, start
from tests.conftest import forge_manifest, tiny_config
from tests.test_runner import Interrupt, metrics_without_time, stop_after

SIZES = [10, 5, 20, 8, 1]  # client k holds SIZES[k] samples, all of class k % 3
BIAS = torch.tensor([2.0, 1.0, 0.0])  # a model that ignores its input: it always scores class 0 first


def constant_model() -> nn.Linear:
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(BIAS)
    return model


def grouped_data():
    groups = np.repeat(np.arange(len(SIZES)), SIZES)
    y = torch.from_numpy(groups % 3)
    x = torch.randn(len(y), 4, generator=torch.Generator().manual_seed(0))
    return taciturn.data.from_tensors(x, y, x[:6], y[:6], groups=groups)


def test_the_distribution_of_a_fixed_model_over_clients_is_computed_by_hand(tmp_path):
    """Round 0's global model is the given one: it predicts class 0 everywhere, with the loss
    -log softmax(BIAS)[c] on a sample of class c. LEAF's rule keeps max(1, floor(0.8 n)) samples of a
    client of n for training: held out 2, 1, 4, 2 and 0 (the client of one sample is never scored)."""
    config = {
        "rounds": 1,
        "partition": {"kind": "natural", "column": "user"},
        "eval": {"clients": 1.0, "client_holdout": 0.2},
        "algorithm": {"fraction": 1.0},
    }
    model, data = constant_model(), grouped_data()
    result = taciturn.run(config, model=model, data=data, out=tmp_path / "r", progress=False)
    row = result.metrics[0]
    held_out = [2, 1, 4, 2]
    labels = [0, 1, 2, 0]
    losses = [float(-F.log_softmax(BIAS, dim=0)[c]) for c in labels]
    accuracies = [1.0 if c == 0 else 0.0 for c in labels]
    assert row["eval_clients"] == 4 and row["eval_samples"] == 9
    for name, values in (("loss", losses), ("accuracy", accuracies)):
        by_client = row[f"client_{name}_by_client"]
        assert by_client.keys() == {"0", "1", "2", "3"}
        assert [by_client[str(k)] for k in range(4)] == pytest.approx(values)
        weighted = sum(n * v for n, v in zip(held_out, values, strict=True)) / 9
        assert row[f"client_{name}"] == pytest.approx(weighted)
        assert row[f"client_{name}_mean"] == pytest.approx(sum(values) / 4)
        ordered = sorted(values)
        assert row[f"client_{name}_min"] == pytest.approx(ordered[0])
        assert row[f"client_{name}_max"] == pytest.approx(ordered[-1])
        for key, q in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9)):  # linear between order statistics
            at = q * 3
            low = math.floor(at)
            expected = ordered[low] + (at - low) * (ordered[min(low + 1, 3)] - ordered[low])
            assert row[f"client_{name}_{key}"] == pytest.approx(expected)
    assert row["client_accuracy"] == pytest.approx(4 / 9)  # clients 0 and 3: 2 + 2 of 9 samples
    partition = json.loads((result.dir / "partition.json").read_text())
    assert partition["held_out"] == [*held_out, 0]
    assert partition["sizes"] == [8, 4, 16, 6, 1]  # what each client trains on
    page = (result.dir / "report.html").read_text()
    assert "Each client&#x27;s own held-out data" in page or "Each client's own held-out data" in page
    assert (result.dir / "plots" / "client_distribution.png").is_file()
    assert "client_accuracy_p10" in page  # a column of the metrics table


def one_hot_run(tmp_path, name, engine, rounds=2):
    """Inputs are one-hot (sample i is e_i) and the model a bias-free linear layer, so a step on a
    batch changes exactly the weight columns of its samples: a column that never moved belongs to a
    sample no client ever trained on."""
    n = 48
    x, y = torch.eye(n), torch.arange(n) % 3

    def model():
        torch.manual_seed(0)
        return nn.Linear(n, 3, bias=False)

    config = {
        "rounds": rounds,
        "partition": {"kind": "iid", "num_clients": 4},
        "algorithm": {"fraction": 1.0, "local": {"epochs": 1, "batch_size": 4, "lr": 0.5}},
        "eval": {"clients": 0.5, "client_holdout": 0.25},
        "engine": engine,
    }
    result = taciturn.run(config, model=model(), data=(x, y, x, y), out=tmp_path / name, progress=False)
    moved = (result.model.weight != model().weight).any(dim=0)
    return result, moved, n


@pytest.mark.parametrize(
    "engine",
    [
        {"executor": "sequential"},
        {"executor": "vectorized"},
        {"executor": "parallel", "workers": 2},
    ],
    ids=lambda e: e["executor"],
)
def test_held_out_samples_are_never_trained_on(tmp_path, engine):
    result, moved, n = one_hot_run(tmp_path, engine["executor"], engine)
    assert int((~moved).sum()) == 4 * 3  # each client of 12 holds out 12 - floor(0.75 * 12) = 3
    config = load_config(result.dir / "config.toml")
    _, data = build_task(config, Streams(config.seed), _objects(n))  # the run's split, rebuilt
    held = data.held_out
    assert np.sort(held.order).tolist() == torch.nonzero(~moved).flatten().tolist()
    for client in range(4):  # and each client's training data is what it keeps
        assert set(data.client_indices(client)).isdisjoint(held.client_indices(client))
    for row in result.metrics:  # the evaluated clients are scored on their own held-out samples
        assert row["eval_clients"] == 2 and row["eval_samples"] == 6


def _objects(n):
    from taciturn.experiments.user import UserObjects

    x, y = torch.eye(n), torch.arange(n) % 3
    return UserObjects(nn.Linear(n, 3, bias=False), (x, y, x, y))


def test_the_same_seed_gives_the_same_split_and_the_sample_does_not_change_it(tmp_path):
    def split(**eval_overrides):
        exp = prepare(tiny_config(eval=eval_overrides), tmp_path / "x")
        return exp.data.order.tolist(), exp.data.held_out.order.tolist(), exp.client_eval

    order, held, evaluation = split(clients=0.5)
    assert split(clients=0.5)[:2] == (order, held)
    assert split(clients=1.0)[:2] == (order, held)  # how many are evaluated does not move the split
    other = prepare(tiny_config(seed=4, eval={"clients": 0.5}), tmp_path / "y")
    assert other.data.held_out.order.tolist() != held
    samples = [evaluation.sample(r) for r in range(4)]
    assert samples == [evaluation.sample(r) for r in range(4)] and len({tuple(s) for s in samples}) > 1
    plain = prepare(tiny_config(), tmp_path / "z")
    assert plain.data.held_out is None and plain.data.num_samples == len(order) + len(held)


def test_resume_equals_an_uninterrupted_run_and_the_columns_can_be_watched(tmp_path):
    tree = dict(
        rounds=5,
        eval={"clients": 0.5},
        checkpoint={"every": 2, "best": "client_accuracy_p10"},
        stop={"metric": "client_loss", "patience": 3},
    )
    whole = start(tiny_config(**tree), tmp_path / "whole", progress=False)
    with pytest.raises(Interrupt):
        start(tiny_config(**tree), tmp_path / "cut", progress=False, callbacks=(stop_after(3),))
    resumed = resume(tmp_path / "cut", progress=False)
    assert metrics_without_time(resumed) == metrics_without_time(whole)
    kept = json.loads((whole.path / "best" / "best.json").read_text())
    assert kept["value"] == max(r["client_accuracy_p10"] for r in whole.read_metrics())
    kept_again = (resumed.path / "best" / "best.json").read_text()
    assert kept_again == (whole.path / "best" / "best.json").read_text()


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"eval": {"client_holdout": 0.3}}, r"client_holdout applies only with eval.clients > 0"),
        ({"eval": {"clients": 0.5, "client_holdout": 1.0}}, r"eval.client_holdout"),
        ({"eval": {"clients": 1.5}}, r"eval.clients"),
        (  # each sampled client's exact score is no DP quantity
            {"eval": {"clients": 0.5}, "privacy": {"enabled": True, "noise_multiplier": 1.0}},
            r"eval.clients with \[privacy\]",
        ),
        ({"eval": {"clients": 0.5}, "secagg": {"enabled": True}}, r"eval.clients with \[secagg\]"),
    ],
)
def test_bad_settings_fail_before_work(tree, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(**tree)


def test_clients_too_small_to_hold_any_sample_out_fail_before_work(tmp_path):
    x, y = torch.randn(6, 4), torch.arange(6) % 2
    config = {"rounds": 1, "partition": {"kind": "natural", "column": "user"}, "eval": {"clients": 0.5}}
    data = taciturn.data.from_tensors(x, y, x, y, groups=np.arange(6))  # one sample per client
    with pytest.raises(ConfigError, match=r"\[eval.client_holdout\] no client holds enough samples"):
        taciturn.run(config, model=nn.Linear(4, 2), data=data, out=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


def test_deployed_runs_and_language_models_refuse_it(tmp_path):
    with pytest.raises(ConfigError, match=r"\[eval.clients\] deployed runs keep each client's data"):
        refuse_undeployable(tiny_config(eval={"clients": 0.5}))
    tree = {
        "model": {"kind": "causal_lm"},
        "data": {"dataset": "instructions"},
        "eval": {"clients": 0.5},
    }
    with pytest.raises(ConfigError, match=r"eval.clients: client-side evaluation scores class labels"):
        types.validate_tree(tree, "<test>")


def test_a_report_of_tampered_client_columns_skips_or_escapes_them(tmp_path):
    """The report reads only the run folder, which someone else may have written: client columns
    that are not numbers leave their rows out of the plot, and text is escaped."""
    rundir = start(tiny_config(rounds=2, eval={"clients": 0.5}), tmp_path / "run", progress=False)
    rows = rundir.read_metrics()
    rows[0]["client_accuracy_p10"] = "high"  # this row leaves the distribution
    rows[-1]["eval_clients"] = "<b>many</b>"
    rows[-1]["client_accuracy_by_client"] = {"0": "<i>x</i>", "1": None, "2": 0.5}
    rundir.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    forge_manifest(rundir.path)  # whoever edits the folder can recompute its digests
    page = types.report(rundir).read_text()
    assert "&lt;b&gt;many&lt;/b&gt; clients" in page and "<b>many</b>" not in page
    assert (rundir.plots / "client_distribution.png").is_file()

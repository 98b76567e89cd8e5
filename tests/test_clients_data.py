"""Per-client data ([data] dataset = "clients"): each client's own records, federated evaluation."""

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from taciturn.data.clients import Schema, read_files
from taciturn.experiments.config import ConfigError, validate
from taciturn.experiments.export import export
from taciturn.experiments.runner import start
from taciturn.tasks.federated_eval import Scores, pooled
from tests.conftest import tiny_config

SIZES = (12, 30, 21)


def write_sites(folder, sizes=SIZES, tests=(4, 10, 0), features=5):
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(3)
    for i, (n, t) in enumerate(zip(sizes, tests, strict=True)):
        y = rng.integers(0, 3, n + t)
        x = (rng.normal(size=(n + t, features)) + y[:, None]).astype(np.float32)
        arrays = {"x_train": x[:n], "y_train": y[:n]}
        if t:
            arrays |= {"x_test": x[n:], "y_test": y[n:]}
        np.savez(folder / f"site-{i:02d}.npz", **arrays)
    return folder


def config(path, **overrides):
    return tiny_config(
        **(
            {
                "rounds": 2,
                "data": {"dataset": "clients", "path": str(path)},
                "partition": {"kind": "given"},
                "algorithm": {"name": "fedavg", "fraction": 1.0, "local": {"batch_size": 8, "lr": 0.1}},
            }
            | overrides
        )
    )


def test_pooled_scores_are_the_metrics_over_all_held_out_samples():
    # two clients: 3 samples, mean loss 1 and accuracy 1/3; 1 sample, loss 5 and accuracy 1
    scores = [Scores(7, 1, {"loss": 5.0, "accuracy": 1.0}), Scores(2, 3, {"loss": 1.0, "accuracy": 1 / 3})]
    assert pooled(scores) == {"loss": 2.0, "accuracy": 0.5, "eval_clients": 2, "eval_samples": 4}
    assert pooled([]) == {"eval_clients": 0, "eval_samples": 0}


def test_each_client_is_its_own_file_and_the_evaluation_is_federated(tmp_path):
    sites = write_sites(tmp_path / "sites")
    run = start(config(sites), tmp_path / "run", progress=False)
    sizes = json.loads(run.partition.read_text())["sizes"]
    assert sizes == list(SIZES)  # client i: the i-th file in name order, nothing split by the seed
    assert json.loads(run.info.read_text())["client_sizes"] == list(SIZES)

    # by hand: the final model (logistic regression) scored on each held-out split, weighted by its size
    params = load_file(export(run.path, tmp_path / "model.safetensors"))
    weight = next(v for k, v in params.items() if k.endswith("weight"))
    bias = next(v for k, v in params.items() if k.endswith("bias"))
    losses, hits, count = [], 0, 0
    for site in read_files(sites):
        if len(site.y_test):
            logits = site.x_test @ weight.T + bias
            losses.append(float(torch.nn.functional.cross_entropy(logits, site.y_test, reduction="sum")))
            hits += int((logits.argmax(1) == site.y_test).sum())
            count += len(site.y_test)
    last = run.read_metrics()[-1]
    assert (last["eval_on"], last["eval_clients"], last["eval_samples"]) == ("clients", 2, 14)
    assert math.isclose(last["loss"], sum(losses) / count, rel_tol=1e-5)
    assert last["accuracy"] == hits / count


def test_a_server_held_out_set_is_used_when_given(tmp_path):
    sites = write_sites(tmp_path / "sites")
    rng = np.random.default_rng(9)
    np.savez(
        tmp_path / "heldout.npz",
        x_test=rng.normal(size=(7, 5)).astype(np.float32),
        y_test=rng.integers(0, 3, 7),
    )
    data = {"dataset": "clients", "path": str(sites), "test": str(tmp_path / "heldout.npz")}
    run = start(config(sites, data=data), tmp_path / "run", progress=False)
    rows = run.read_metrics()
    assert all(r["eval_on"] == "server" and "eval_samples" not in r for r in rows)
    assert json.loads(run.info.read_text())["evaluation"].startswith(
        "on the server's held-out set (7 samples"
    )


def test_a_per_client_factory_gives_the_same_run_as_the_files(tmp_path, monkeypatch):
    sites = write_sites(tmp_path / "sites")
    module = tmp_path / "siloplugin.py"
    module.write_text(
        "import numpy as np\nfrom pathlib import Path\n"
        "def load(folder):\n"
        "    return [dict(np.load(p)) for p in sorted(Path(folder).glob('*.npz'))]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from_files = start(config(sites), tmp_path / "files", progress=False)
    data = {"dataset": "clients", "factory": "siloplugin:load", "kwargs": {"folder": str(sites)}}
    from_factory = start(config(sites, data=data), tmp_path / "factory", progress=False)
    drop = ("wall_s",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in from_files.read_metrics()] == [
        {k: v for k, v in r.items() if k not in drop} for r in from_factory.read_metrics()
    ]


def test_bad_per_client_data_fails_before_work_and_says_why(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.path .* or data\.factory"):
        tiny_config(data={"dataset": "clients"}, partition={"kind": "given"})
    with pytest.raises(ConfigError, match=r"partition\.kind = 'given'"):
        tiny_config(data={"dataset": "clients", "path": "x"}, partition={"kind": "iid", "num_clients": 3})
    plain = validate({"data": {"dataset": "clients", "path": "x"}}, "<test>")
    assert plain.partition.kind == "given"  # its default
    with pytest.raises(ConfigError, match=r"holds no \.npz files"):
        start(config(tmp_path), tmp_path / "run", progress=False)
    write_sites(tmp_path / "mixed", sizes=(5, 6), tests=(0, 0))
    write_sites(tmp_path / "wide", sizes=(5,), tests=(0,), features=7)
    (tmp_path / "wide" / "site-00.npz").rename(tmp_path / "mixed" / "site-99.npz")
    with pytest.raises(
        ConfigError, match=r"client 2's samples are \(7,\).*every client's data must have the same"
    ):
        start(config(tmp_path / "mixed", data={"dataset": "clients", "path": str(tmp_path / "mixed")}),
              tmp_path / "run2", progress=False)  # fmt: skip
    with pytest.raises(ConfigError, match="no held-out data"):
        start(config(write_sites(tmp_path / "untested", (5, 6), (0, 0))), tmp_path / "run3", progress=False)
    np.savez(tmp_path / "pickled.npz", x_train=np.array([{"a": 1}], dtype=object), y_train=np.array([0]))
    with pytest.raises(ConfigError, match="cannot be read as arrays"):
        start(config(tmp_path / "pickled.npz"), tmp_path / "run4", progress=False)


def test_client_side_evaluation_is_refused_with_per_client_data(tmp_path):
    """[eval] clients carves held-out splits out of a partition; per-client data has its own, and its
    eval_clients/eval_samples columns would be written twice."""
    with pytest.raises(ConfigError, match=r"eval\.clients at 0"):
        config(write_sites(tmp_path / "sites"), eval={"every": 1, "clients": 0.5})


def test_a_schema_travels_as_integers():
    schema = Schema((1, 28, 28), 10, ())
    assert Schema.from_fields(schema.fields()) == schema
    assert Schema.from_fields(Schema((6,), 0, (2,)).fields()) == Schema((6,), 0, (2,))


def test_the_report_says_where_the_model_was_evaluated(tmp_path):
    from taciturn.report.html import write_report

    run = start(config(write_sites(tmp_path / "sites")), tmp_path / "run", progress=False)
    page = write_report(run).read_text()
    assert "Evaluated by the clients (federated evaluation)" in page
    assert "over 14 samples on 2 clients" in page

"""Models with buffers (BatchNorm): running statistics federated with the weights (issue 15)."""

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

import taciturn
from taciturn.experiments.config import ConfigError


def bn_mlp(seed=0, features=5, hidden=4, classes=2):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(features, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, classes)
    )


def two_classes(n0=120, n1=80, features=5):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n0 + n1, features, generator=g)
    y = torch.cat([torch.zeros(n0, dtype=torch.long), torch.ones(n1, dtype=torch.long)])
    x[y == 1] += 1.5
    return x, y


def test_running_statistics_are_averaged_weighted_by_samples(tmp_path):
    """One full-batch step per client: client k's running mean is 0.9 * 0 + 0.1 * mean_k(h) and its
    running variance 0.9 * 1 + 0.1 * var_k(h) (unbiased), h the first layer at the start weights;
    the server holds their n_k-weighted averages (McMahan et al.'s FedAvg applied to every tensor)."""
    x, y = two_classes()
    config = {
        "rounds": 1,
        "partition": {"kind": "one_class", "num_clients": 2},  # client k holds class k: 120 and 80 samples
        "algorithm": {"fraction": 1.0, "local": {"steps": 1, "batch_size": 1000, "lr": 0.1}},
        "engine": {"executor": "sequential"},
    }
    start = bn_mlp()
    result = taciturn.run(
        config, model=start, data=(x, y, x[:10], y[:10]), out=tmp_path / "run", report=False
    )
    with torch.no_grad():
        h = start[0](x)
    n = torch.tensor([120.0, 80.0])
    means = torch.stack([h[y == k].mean(0) for k in (0, 1)])
    variances = torch.stack([h[y == k].var(0, unbiased=True) for k in (0, 1)])
    expected_mean = (n[:, None] * 0.1 * means).sum(0) / n.sum()
    expected_var = (n[:, None] * (0.9 + 0.1 * variances)).sum(0) / n.sum()
    trained = result.model[1]
    assert torch.allclose(trained.running_mean, expected_mean, atol=1e-6)
    assert torch.allclose(trained.running_var, expected_var, atol=1e-6)
    # Evaluation uses the averaged statistics (eval mode), not the test batch's.
    with torch.no_grad():
        assert result.metrics[-1]["loss"] == pytest.approx(
            float(F.cross_entropy(result.model(x[:10]), y[:10])), rel=1e-5
        )


class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1))


def test_a_batchnorm_cnn_on_iid_data_reaches_its_centralized_twin(tmp_path):
    """FedAvg, 4 IID clients all taking part, 4 local epochs per round, against the same model
    trained centrally with the same optimizer for as many epochs as each client ran: within 2
    accuracy points (on this seed: 96.9% federated, 98.3% centralized)."""
    rounds, epochs, lr, batch = 8, 4, 0.2, 64
    config = {
        "seed": 1,
        "rounds": rounds,
        "data": {"dataset": "digits"},
        "partition": {"kind": "iid", "num_clients": 4},
        "algorithm": {"fraction": 1.0, "local": {"epochs": epochs, "batch_size": batch, "lr": lr}},
        "eval": {"every": rounds},
        "checkpoint": {"every": rounds},
        "engine": {"executor": "sequential"},
    }
    torch.manual_seed(0)
    model = SmallCnn()
    twin = SmallCnn()
    twin.load_state_dict(model.state_dict())
    result = taciturn.run(config, model=model, out=tmp_path / "fed", report=False)
    from taciturn.data.digits import load
    from taciturn.experiments.config import validate
    from taciturn.experiments.runner import Streams

    digits = load(Streams(validate(config, "<test>").seed).numpy(0, -1, "data"))
    optimizer = torch.optim.SGD(twin.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    for _ in range(rounds * epochs):
        twin.train()
        for idx in torch.randperm(len(digits.y_train), generator=g).split(batch):
            optimizer.zero_grad()
            F.cross_entropy(twin(digits.x_train[idx]), digits.y_train[idx]).backward()
            optimizer.step()
    twin.eval()
    with torch.no_grad():
        central = float((twin(digits.x_test).argmax(1) == digits.y_test).float().mean())
    federated = result.metrics[-1]["accuracy"]
    assert central > 0.9  # the twin learned: the comparison means something
    assert abs(federated - central) <= 0.02, (federated, central)


class BasicBlock(nn.Module):
    """He et al., "Deep Residual Learning for Image Recognition", CVPR 2016: the ResNet-18 block."""

    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + self.shortcut(x))


def resnet18_style(width=4, classes=10):
    """ResNet-18's layout (four stages of two basic blocks) at 1/16 of its width."""
    layers, inputs = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()], width
    for stage, stride in enumerate((1, 2, 2, 2)):
        outputs = width * 2**stage
        layers += [BasicBlock(inputs, outputs, stride), BasicBlock(outputs, outputs, 1)]
        inputs = outputs
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, classes))


def resnet18(classes=10):
    """torchvision's ResNet-18 when torchvision is installed, else its layout at 1/16 of the width."""
    try:
        from torchvision.models import resnet18 as torchvision_resnet18
    except (ImportError, RuntimeError):  # RuntimeError: a CUDA torchvision beside a CPU torch
        return resnet18_style(classes=classes)
    return torchvision_resnet18(num_classes=classes)


def test_a_resnet18_trains_a_round_of_fedavg_computed_by_hand_and_exports(tmp_path):
    """One round, three clients (a natural partition: sample i belongs to client i % 3), one
    full-batch SGD step each: the global model is the n_k-weighted average of three copies of the
    model each stepped by torch.optim.SGD on its client's samples, weights and BatchNorm statistics
    alike (FedAvg, McMahan et al. 2017, Alg. 1, on every floating tensor)."""
    torch.manual_seed(0)
    x, y = torch.randn(48, 3, 16, 16), torch.arange(48) % 10
    groups = torch.arange(40) % 3  # 14, 13 and 13 samples
    config = {
        "rounds": 1,
        "partition": {"kind": "natural", "column": "groups"},  # from_tensors(groups=) names them
        "algorithm": {"fraction": 1.0, "local": {"steps": 1, "batch_size": 64, "lr": 0.05}},
        "engine": {"executor": "sequential"},
    }
    start = resnet18()
    data = taciturn.data.from_tensors(x[:40], y[:40], x[40:], y[40:], groups=groups)
    result = taciturn.run(config, model=copy.deepcopy(start), data=data, out=tmp_path / "r", report=False)
    assert result.metrics[-1]["clients"] == 3 and result.metrics[-1]["failed"] == 0
    expected: dict[str, torch.Tensor] = {}
    for k in range(3):
        client = copy.deepcopy(start).train()
        optimizer = torch.optim.SGD(client.parameters(), lr=0.05)
        F.cross_entropy(client(x[:40][groups == k]), y[:40][groups == k]).backward()
        optimizer.step()
        share = float((groups == k).sum()) / 40
        for name, tensor in client.state_dict().items():
            if tensor.is_floating_point():
                expected[name] = expected.get(name, 0) + share * tensor.detach()
    trained = result.model.state_dict()
    for name, tensor in expected.items():
        assert torch.allclose(trained[name], tensor, atol=1e-5), name
    assert any(not torch.allclose(t, start.state_dict()[n]) for n, t in expected.items())  # it moved
    path = taciturn.export(result.dir, tmp_path / "resnet.safetensors")
    fresh = resnet18()
    fresh.load_state_dict(load_file(str(path)))  # strict, num_batches_tracked included
    for name, tensor in trained.items():
        assert torch.equal(fresh.state_dict()[name], tensor), name


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"algorithm": {"name": "fedkseed"}},
            r"\[algorithm.name\] 'fedkseed' cannot federate a model with buffers",
        ),
        (
            {"engine": {"executor": "vectorized"}},
            r"\[engine.executor\] 'vectorized' trains clients under vmap",
        ),
    ],
)
def test_combinations_that_cannot_federate_buffers_are_refused_before_work(tmp_path, overrides, message):
    x, y = two_classes()
    config = {
        "rounds": 1,
        "partition": {"kind": "iid", "num_clients": 2},
        "engine": {"executor": "sequential"},
    }
    with pytest.raises(ConfigError, match=message):
        taciturn.run(
            config | overrides, model=bn_mlp(), data=(x, y, x, y), out=tmp_path / "run", report=False
        )
    assert not (tmp_path / "run").exists()


def test_batchnorm_with_a_cumulative_average_is_refused(tmp_path):
    x, y = two_classes()
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4, momentum=None), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"BatchNorm with momentum=None"):
        config = {"rounds": 1, "partition": {"kind": "iid", "num_clients": 2}}
        taciturn.run(config, model=model, data=(x, y, x, y), out=tmp_path / "run", report=False)


def test_a_batch_of_one_is_skipped_with_batchnorm(tmp_path):
    """33 samples in batches of 32 leave a batch of one, which BatchNorm cannot normalise in training:
    the step is skipped (DataLoader's drop_last), so one step per client equals one step of 32."""
    x, y = two_classes(n0=33, n1=33)
    config = {
        "rounds": 1,
        "partition": {"kind": "one_class", "num_clients": 2},
        "algorithm": {"fraction": 1.0, "local": {"epochs": 1, "batch_size": 32, "lr": 0.1}},
        "engine": {"executor": "sequential"},
    }
    result = taciturn.run(
        config, model=bn_mlp(), data=(x, y, x[:4], y[:4]), out=tmp_path / "run", report=False
    )
    assert result.metrics[-1]["failed"] == 0 and result.metrics[-1]["clients"] == 2
    assert result.model[1].num_batches_tracked == 0  # integer buffers are not federated


@pytest.mark.parametrize("buffers", ["federated", "local"])
def test_resume_of_a_batchnorm_model_ends_with_the_numbers_of_an_uninterrupted_run(tmp_path, buffers):
    """With local buffers (FedBN), the clients' own statistics come back from the checkpoint too."""
    from taciturn.core.state_store import MemoryStateStore
    from taciturn.experiments import runner
    from taciturn.experiments.config import validate
    from taciturn.experiments.user import UserObjects
    from taciturn.report.rundir import RunDir
    from tests.test_runner import Interrupt, metrics_without_time, stop_after

    x, y = two_classes()
    data = taciturn.data.from_tensors(x, y, x[:20], y[:20])
    tree = {
        "rounds": 4,
        "partition": {"kind": "iid", "num_clients": 4},
        "algorithm": {"fraction": 0.5, "local": {"batch_size": 16}},
        "checkpoint": {"every": 2},
        "engine": {"executor": "sequential"},
        "model": {"buffers": buffers},
    }
    whole = taciturn.run(tree, model=bn_mlp(), data=data, out=tmp_path / "whole", report=False)
    model = {"kind": "python", "buffers": buffers}
    config = validate({**tree, "model": model, "data": {"dataset": "python"}}, "<test>")
    with pytest.raises(Interrupt):
        runner.start(
            config,
            tmp_path / "cut",
            progress=False,
            callbacks=(stop_after(3),),
            objects=UserObjects(bn_mlp(), data),
        )
    resumed = taciturn.resume(tmp_path / "cut", model=bn_mlp(), data=data, report=False)
    assert metrics_without_time(RunDir(resumed.dir)) == metrics_without_time(RunDir(whole.dir))
    assert torch.equal(resumed.model[1].running_var, whole.model[1].running_var)
    stores = []
    for run in (whole.dir, resumed.dir):
        store = MemoryStateStore()
        store.load(max(p.parent for p in Path(run).rglob("server.safetensors")))
        stores.append(store)
    assert list(stores[0].clients()) == list(stores[1].clients())
    assert bool(list(stores[0].clients())) == (buffers == "local")
    for client in stores[0].clients():
        for name, tensor in stores[0].get(client).items():
            assert torch.equal(stores[1].get(client)[name], tensor), (client, name)


@pytest.mark.parametrize("executor", ["sequential", "parallel"])
def test_local_buffers_stay_with_each_client_and_the_server_keeps_its_own(tmp_path, executor):
    """FedBN (model.buffers = "local"): one full-batch step per client from the initial statistics.
    Each client's stored running statistics are what torch's BatchNorm1d computes on its own batch
    at the start weights; nothing of them is averaged, so the server's stay the initial ones."""
    from taciturn.core.disk_store import DiskStateStore
    from taciturn.core.state_store import MemoryStateStore

    x, y = two_classes()
    config = {
        "rounds": 1,
        "partition": {"kind": "one_class", "num_clients": 2},  # client k holds class k
        "algorithm": {"fraction": 1.0, "local": {"steps": 1, "batch_size": 1000, "lr": 0.1}},
        "engine": {"executor": executor, "workers": 2},  # parallel: states shared on disk
        "model": {"buffers": "local"},
    }
    start = bn_mlp()
    result = taciturn.run(
        config, model=start, data=(x, y, x[:10], y[:10]), out=tmp_path / "run", report=False
    )
    (checkpoint,) = (p.parent for p in (tmp_path / "run").rglob("server.safetensors"))
    store = MemoryStateStore() if executor == "sequential" else DiskStateStore(tmp_path / "s.bin", 2)
    store.load(checkpoint)
    for k in (0, 1):
        state = store.get(k)
        reference = bn_mlp()[:2].train()
        with torch.no_grad():
            reference(x[y == k])
        assert torch.allclose(state["buffers/1.running_mean"], reference[1].running_mean, atol=1e-6)
        assert torch.allclose(state["buffers/1.running_var"], reference[1].running_var, atol=1e-6)
    trained = result.model
    assert torch.equal(trained[1].running_mean, start[1].running_mean)  # zeros: the server's own
    assert torch.equal(trained[1].running_var, start[1].running_var)
    assert not torch.equal(trained[0].weight, start[0].weight)  # the weights were still averaged


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"algorithm": {"name": "ferret"}}, r"'ferret' cannot federate a model with buffers"),
        ({"engine": {"executor": "vectorized"}}, r"'vectorized' trains clients under vmap"),
    ],
)
def test_local_buffers_refuse_what_cannot_keep_them_before_work(tmp_path, overrides, message):
    x, y = two_classes()
    config = {"rounds": 1, "partition": {"kind": "iid", "num_clients": 2}, "model": {"buffers": "local"}}
    with pytest.raises(ConfigError, match=message):
        taciturn.run(config | overrides, model=bn_mlp(), data=(x, y, x, y), out=tmp_path / "r", report=False)
    plain = nn.Sequential(nn.Linear(5, 2))
    with pytest.raises(ConfigError, match=r"\[model.buffers\] 'local' needs a model with buffers"):
        taciturn.run(config, model=plain, data=(x, y, x, y), out=tmp_path / "r", report=False)
    assert not (tmp_path / "r").exists()


def test_fedbn_scores_each_clients_own_model_on_held_out_data_like_its_own(tmp_path):
    """FedBN's evaluation (Li et al., ICLR 2021, Sec. 5), by hand: two clients holding one class each,
    one full-batch step. Client k's model is the global weights with k's own statistics (BatchNorm1d
    run on k's data at the start weights); its held-out data are the test samples of its class; the
    metrics report the means over the two clients next to the global model's scores."""
    x, y = two_classes()
    test = torch.arange(0, 200, 7)  # 18 samples of class 0, 11 of class 1
    config = {
        "rounds": 1,
        "partition": {"kind": "one_class", "num_clients": 2},  # client k holds class k
        "algorithm": {"fraction": 1.0, "local": {"steps": 1, "batch_size": 1000, "lr": 0.1}},
        "engine": {"executor": "sequential"},
        "model": {"buffers": "local"},
    }
    result = taciturn.run(
        config, model=bn_mlp(), data=(x, y, x[test], y[test]), out=tmp_path / "run", report=True
    )
    first, last = result.metrics
    assert first["local_clients"] == 0 and "local_accuracy" not in first  # nobody holds statistics yet
    losses, accuracies = [], []
    for k in (0, 1):
        statistics = bn_mlp()[:2].train()
        with torch.no_grad():
            statistics(x[y == k])
        own = copy.deepcopy(result.model).eval()  # the global weights ...
        own[1].running_mean.copy_(statistics[1].running_mean)  # ... with client k's statistics
        own[1].running_var.copy_(statistics[1].running_var)
        mine = y[test] == k
        with torch.no_grad():
            outputs = own(x[test][mine])
        losses.append(float(F.cross_entropy(outputs, y[test][mine])))
        accuracies.append(int((outputs.argmax(1) == y[test][mine]).sum()) / int(mine.sum()))
    assert last["local_clients"] == 2
    assert last["local_loss"] == pytest.approx(sum(losses) / 2, rel=1e-5)
    assert last["local_accuracy"] == pytest.approx(sum(accuracies) / 2, abs=1e-9)
    with torch.no_grad():  # the global model: the server's initial statistics, on the whole test set
        assert last["loss"] == pytest.approx(float(F.cross_entropy(result.model(x[test]), y[test])), rel=1e-5)
    assert abs(last["local_loss"] - last["loss"]) > 1e-3  # the two evaluations differ here
    page = (Path(result.dir) / "report.html").read_text()
    assert "Each client's own model (FedBN)" in page and f"mean loss {last['local_loss']:.4g}" in page

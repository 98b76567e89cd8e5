"""engine.device: resolution, and where tensors land. This machine has no GPU: the placement logic
is checked on the CPU and on PyTorch's "meta" device (shapes without storage); a GPU run is not."""

import numpy as np
import pytest
import torch

from taciturn.core import device
from taciturn.core.device import DeviceError, resolve
from taciturn.core.message import Message
from taciturn.core.packing import pack, unpack
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import on_device, start
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config
from tests.test_runner import metrics_without_time


@pytest.fixture
def on(monkeypatch):
    """Make a device current for the test, and the CPU again after it."""

    def use(name):
        device.use(torch.device(name))

    yield use
    device.use(torch.device("cpu"))


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve("auto") == torch.device("cuda")


def test_a_device_the_machine_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"'cuda': this PyTorch sees no CUDA GPU"):
        resolve("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve("cuda:0") == torch.device("cuda:0")
    with pytest.raises(DeviceError, match=r"'cuda:2': this machine has 1 CUDA device"):
        resolve("cuda:2")
    with pytest.raises(DeviceError, match=r"unknown device 'gpu'"):
        resolve("gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_run_on_a_missing_gpu_fails_before_work(tmp_path):
    with pytest.raises(ConfigError, match=r"\[engine.device\] device 'cuda'"):
        start(
            tiny_config(engine={"executor": "sequential", "device": "cuda"}), tmp_path / "run", progress=False
        )
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"\[engine.device\] String should match pattern"):
        tiny_config(engine={"device": "gpu"})


def test_decoded_messages_and_checkpoints_land_on_the_run_device(on):
    from taciturn.algorithms.fedavg import FedAvgState

    message = Message.from_tensors({"w": torch.ones(2, 3)}, num_samples=4)
    packed = pack(FedAvgState({"w": torch.ones(2)}))
    on("meta")
    assert message.tensors()["w"].device.type == "meta"
    assert unpack(FedAvgState, packed).params["w"].device.type == "meta"


def test_the_dataset_and_its_batches_move_to_the_device(on):
    from taciturn.data.datasets import ArrayDataset
    from taciturn.data.federated import FederatedData

    dataset = ArrayDataset(
        "d", torch.ones(6, 2), torch.zeros(6, dtype=torch.long), torch.ones(2, 2), torch.zeros(2), 2, ""
    )
    moved = on_device(dataset, torch.device("meta"))
    assert {t.device.type for t in (moved.x_train, moved.y_train, moved.x_test, moved.y_test)} == {"meta"}
    data = FederatedData.from_parts(moved, [np.arange(3), np.arange(3, 6)])
    x, y = data.batch(data.client_indices(1))
    assert x.device.type == "meta" and x.shape == (3, 2) and y.shape == (3,)


def test_on_a_gpu_clients_stay_in_this_process(on):
    from taciturn.algorithms import build_algorithm
    from taciturn.core.rng import Streams
    from taciturn.experiments.engine_setup import choose_executor
    from taciturn.experiments.runner import build_task

    config = tiny_config(engine={"executor": "parallel"})
    task, data = build_task(config, Streams(0))
    on("cuda")  # only the decision is taken: nothing is allocated
    with pytest.raises(ConfigError, match=r"'parallel' runs CPU worker processes; on cuda use"):
        choose_executor(config, build_algorithm(config.algorithm), task, data)
    auto = tiny_config(engine={"executor": "auto"})
    assert choose_executor(auto, build_algorithm(auto.algorithm), task, data).executor == "vectorized"


def test_cpu_named_gives_the_numbers_of_auto_without_a_gpu(tmp_path):
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("auto picks an accelerator here")
    a = start(tiny_config(engine={"executor": "sequential", "device": "cpu"}), tmp_path / "a", progress=False)
    b = start(
        tiny_config(engine={"executor": "sequential", "device": "auto"}), tmp_path / "b", progress=False
    )
    assert metrics_without_time(RunDir(a.path)) == metrics_without_time(RunDir(b.path))

"""Width families, parameterisations, the squared-loss task and data subsets."""

import math

import numpy as np
import pytest
import torch

from taciturn.data.datasets import ArrayDataset
from taciturn.data.subset import stratified_sample, subset
from taciturn.tasks.layers import ScaledLinear, effective_scales
from taciturn.tasks.models import build_model
from taciturn.tasks.squared_error import SquaredErrorTask, num_outputs


def initialised(model, seed=0):
    torch.manual_seed(seed)
    for module in model.modules():
        if module is not model and hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model


@pytest.mark.parametrize("kind", ["mlp", "lenet"])
def test_standard_and_ntk_parameterisations_are_the_same_function_at_initialisation(kind):
    x = torch.randn(5, 1, 28, 28)
    nets = [initialised(build_model(kind, (1, 28, 28), 3, parameterization=p)) for p in ("standard", "ntk")]
    torch.testing.assert_close(nets[0](x), nets[1](x), rtol=1e-5, atol=1e-5)


def test_ntk_parameterisation_draws_unit_gaussians_and_scales_them_in_the_forward_pass():
    net = initialised(build_model("mlp", (784,), 1, hidden=[2048], parameterization="ntk", weight_var=2.0))
    first = net[1]
    assert isinstance(first, ScaledLinear)
    assert first.weight_scale == pytest.approx(math.sqrt(2.0 / 784)) and first.bias_scale == pytest.approx(
        0.1
    )
    assert float(first.weight.detach().std()) == pytest.approx(1.0, abs=0.01)  # 1.6M draws
    scales = effective_scales(net)
    assert scales["3.weight"] == pytest.approx(math.sqrt(2.0 / 2048)) and scales["3.bias"] == pytest.approx(
        0.1
    )
    x = torch.randn(3, 784)
    with torch.no_grad():
        torch.testing.assert_close(first(x), x @ (first.weight * first.weight_scale).T + 0.1 * first.bias)


@pytest.mark.parametrize("kind", ["mlp", "lenet"])
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
def test_the_task_forward_applies_the_layer_scales(kind, parameterization):
    """The task's fast pure forward (tasks/functional.py) must compute what the module computes."""
    net = initialised(build_model(kind, (1, 28, 28), 3, parameterization=parameterization))
    task = SquaredErrorTask(net, torch.zeros(1, 1, 28, 28), torch.zeros(1, dtype=torch.long))
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(task.logits(dict(net.named_parameters()), x), net(x))
    assert task.mlp is None  # the low-rank path's backward is cross-entropy's


def test_pytorch_parameterisation_keeps_plain_layers():
    net = build_model("mlp", (10,), 2)
    assert type(net[1]) is torch.nn.Linear and set(effective_scales(net).values()) == {1.0}


def test_lenet_width_multiplies_every_layer():
    # k = 2 on 28x28: conv 1->12 (5x5), conv 12->32, fc 32*4*4 -> 240 -> 168 -> 10
    net = build_model("lenet", (1, 28, 28), 10, width=2)
    expected = (12 * 25 + 12) + (32 * 12 * 25 + 32) + (512 * 240 + 240) + (240 * 168 + 168) + (168 * 10 + 10)
    assert sum(p.numel() for p in net.parameters()) == expected
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="too small for the LeNet"):
        build_model("lenet", (1, 8, 8), 10)


def test_squared_error_loss_and_predictions_by_hand():
    model = torch.nn.Identity()
    task = SquaredErrorTask(model, torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64))
    assert num_outputs(2) == 1 and num_outputs(10) == 10
    # one output regresses the label: 1/(2B) sum (f - y)^2 = ((0.5)^2 + (0.2)^2) / 4
    out, y = torch.tensor([[0.5], [0.8]]), torch.tensor([0, 1])
    assert float(task.loss({}, (out, y))) == pytest.approx((0.25 + 0.04) / 4)
    assert task.predict(out).tolist() == [0, 1]
    # three classes: one-hot targets, argmax prediction
    out3, y3 = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]), torch.tensor([0, 1])
    assert float(task.loss({}, (out3, y3))) == pytest.approx((0.0 + (1 + 4)) / 4)
    assert task.predict(out3).tolist() == [0, 2]
    scores = task.evaluate_on({}, out3, y3)
    assert scores == {"loss": pytest.approx(5 / 4), "accuracy": 0.5}


def toy_dataset():
    y = torch.tensor([0, 1, 2, 3] * 10)
    x = torch.arange(40, dtype=torch.float32).reshape(40, 1)
    return ArrayDataset("toy", x, y, x[:8], y[:8], 4, "toy")


def test_subset_keeps_and_relabels_classes_then_samples_each_class_in_proportion(rng):
    small = subset(toy_dataset(), rng, classes=[3, 1], train_size=6, test_size=2)
    assert small.num_classes == 2 and "classes [3, 1]" in small.source
    assert sorted(small.y_train.tolist()) == [0, 0, 0, 1, 1, 1]
    # relabelled: old class 3 is new 0, old 1 is new 1 (x encodes the old label as x mod 4)
    assert all((int(x) % 4 == 3) == (int(y) == 0) for x, y in zip(small.x_train, small.y_train, strict=True))
    assert sorted(small.y_test.tolist()) == [0, 1]


def test_stratified_sample_uses_largest_remainders_and_refuses_impossible_sizes(rng):
    labels = np.array([0] * 5 + [1] * 3 + [2] * 2)
    chosen = stratified_sample(labels, 5, rng, "train")  # exact shares 2.5, 1.5, 1.0
    assert np.bincount(labels[chosen], minlength=3).tolist() in ([3, 1, 1], [2, 2, 1])
    assert len(set(chosen.tolist())) == 5
    with pytest.raises(ValueError, match=r"data\.train_size = 11, but only 10 train samples"):
        stratified_sample(labels, 11, rng, "train")
    with pytest.raises(ValueError, match="at least two distinct labels"):
        subset(toy_dataset(), rng, classes=[1, 1])

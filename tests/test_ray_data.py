"""How the Ray executor puts the training data into the object store (engine/ray_executor.py)."""

import numpy as np
import pytest
import torch

from taciturn.data.datasets import ArrayDataset

pytest.importorskip("ray")  # the [ray] extra; `make test` installs it
from taciturn.engine.ray_executor import _from_shared, _shared


def test_the_data_goes_as_numpy_and_comes_back_as_the_same_tensors_without_a_copy():
    dataset = ArrayDataset(
        name="toy",
        x_train=torch.arange(12, dtype=torch.float32).reshape(3, 2, 2),
        y_train=torch.tensor([2, 0, 1]),
        x_test=torch.ones(1, 2, 2),
        y_test=torch.tensor([1]),
        num_classes=3,
        source="by hand",
        groups=np.array([7, 7, 8]),
    )
    shared, tensors = _shared(dataset)
    assert sorted(tensors) == ["x_test", "x_train", "y_test", "y_train"]
    assert isinstance(shared["x_train"], np.ndarray) and isinstance(shared["groups"], np.ndarray)
    shared["x_train"].flags.writeable = False  # as the object store hands it out
    back = _from_shared((shared, tensors))
    assert back.x_train.data_ptr() == shared["x_train"].ctypes.data  # a view of the shared buffer
    for name in tensors:
        assert torch.equal(getattr(back, name), getattr(dataset, name))
        assert getattr(back, name).dtype == getattr(dataset, name).dtype
    assert isinstance(back.groups, np.ndarray) and back.groups.tolist() == [7, 7, 8]
    assert (back.name, back.num_classes, back.source) == ("toy", 3, "by hand")

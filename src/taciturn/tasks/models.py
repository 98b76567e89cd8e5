"""Models for classification: logistic regression, MLP, and the 2-conv CNN of McMahan et al.

McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017, Sec. 3: "a CNN with two 5x5 convolution layers
(the first with 32 channels, the second with 64, each followed with 2x2 max pooling), a fully
connected layer with 512 units and ReLU activation, and a final softmax output layer".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn


def logistic_regression(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def mlp(input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (200,)) -> nn.Module:
    """784-200-10 by default (McMahan et al.'s "2NN" has two hidden layers of 200: hidden=(200, 200))."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def cnn(input_shape: Sequence[int], num_classes: int, padding: str = "same") -> nn.Module:
    """conv5x5-32, pool, conv5x5-64, pool, fc-512, fc-C.

    ``padding="same"`` is the paper's network (3136 -> 512 on 28x28 input, 1,663,370 parameters);
    ``"valid"`` is the common no-padding variant (1024 -> 512, 582,026 parameters) that the
    Flower/pfl anchors in ``benchmarks/`` use.
    """
    if padding not in ("same", "valid"):
        raise ValueError(f"cnn padding must be 'same' or 'valid', got {padding!r}")
    pad = 2 if padding == "same" else 0
    channels, height, width = input_shape
    for _ in range(2):
        height, width = (height + 2 * pad - 4) // 2, (width + 2 * pad - 4) // 2
    if height < 1 or width < 1:
        raise ValueError(f"input {tuple(input_shape)} is too small for the CNN with padding={padding!r}")
    return nn.Sequential(
        nn.Conv2d(channels, 32, 5, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * height * width, 512),
        nn.ReLU(),
        nn.Linear(512, num_classes),
    )


def build_model(kind: str, input_shape: Sequence[int], num_classes: int, **options) -> nn.Module:
    builders = {"logreg": logistic_regression, "mlp": mlp, "cnn": cnn}
    if kind not in builders:
        raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(builders)}")
    return builders[kind](input_shape, num_classes, **options)

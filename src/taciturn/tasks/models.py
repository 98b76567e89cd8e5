"""Models for classification: logistic regression, MLP, McMahan et al.'s 2-conv CNN and LeNet-5.

McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017, Sec. 3: "a CNN with two 5x5 convolution layers
(the first with 32 channels, the second with 64, each followed with 2x2 max pooling), a fully
connected layer with 512 units and ReLU activation, and a final softmax output layer".

Width families (Jian & Liu, "Widening the Network Mitigates the Impact of Data Heterogeneity on
FedAvg", ICML 2025): the MLP's width is its ``hidden`` list (their FNN is 784-n-n-out) and
``lenet(width=k)`` is their CNN_k, LeNet-5 with every layer k times wider.

Every builder takes a ``parameterization`` (see ``layers``): PyTorch's default initialisation,
the "standard" Gaussian one, or the NTK parameterisation of Jacot et al. 2018.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from taciturn.tasks.layers import BIAS_VAR, WEIGHT_VAR, Kind, Parameterization, conv2d, linear


def logistic_regression(
    input_shape: Sequence[int], num_classes: int, parameterization: Parameterization | None = None
) -> nn.Module:
    return nn.Sequential(nn.Flatten(), linear(math.prod(input_shape), num_classes, parameterization))


def mlp(
    input_shape: Sequence[int],
    num_classes: int,
    hidden: Sequence[int] = (200,),
    parameterization: Parameterization | None = None,
) -> nn.Module:
    """784-200-10 by default (McMahan et al.'s "2NN" has two hidden layers of 200: hidden=(200, 200))."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in hidden:
        layers += [linear(width, h, parameterization), nn.ReLU()]
        width = h
    layers.append(linear(width, num_classes, parameterization))
    return nn.Sequential(*layers)


def _pooled_size(input_shape: Sequence[int], pad: int, name: str) -> tuple[int, int]:
    """Height and width after two (conv 5x5 with ``pad``, max-pool 2x2) stages."""
    _, height, width = input_shape
    for _ in range(2):
        height, width = (height + 2 * pad - 4) // 2, (width + 2 * pad - 4) // 2
    if height < 1 or width < 1:
        raise ValueError(f"input {tuple(input_shape)} is too small for the {name}")
    return height, width


def cnn(
    input_shape: Sequence[int],
    num_classes: int,
    padding: str = "same",
    parameterization: Parameterization | None = None,
) -> nn.Module:
    """conv5x5-32, pool, conv5x5-64, pool, fc-512, fc-C.

    ``padding="same"`` is the paper's network (3136 -> 512 on 28x28 input, 1,663,370 parameters);
    ``"valid"`` is the common no-padding variant (1024 -> 512, 582,026 parameters) that the
    Flower/pfl anchors in ``benchmarks/`` use.
    """
    if padding not in ("same", "valid"):
        raise ValueError(f"cnn padding must be 'same' or 'valid', got {padding!r}")
    pad = 2 if padding == "same" else 0
    height, width = _pooled_size(input_shape, pad, f"CNN with padding={padding!r}")
    p = parameterization
    return nn.Sequential(
        conv2d(input_shape[0], 32, 5, pad, p),
        nn.ReLU(),
        nn.MaxPool2d(2),
        conv2d(32, 64, 5, pad, p),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        linear(64 * height * width, 512, p),
        nn.ReLU(),
        linear(512, num_classes, p),
    )


def lenet(
    input_shape: Sequence[int],
    num_classes: int,
    width: int = 1,
    parameterization: Parameterization | None = None,
) -> nn.Module:
    """CNN_k of Jian & Liu (Sec. 5, Fig. 2): LeNet-5 with k times the channels and units.

    conv5x5-6k, pool, conv5x5-16k, pool, fc-120k, fc-84k, fc-C (valid padding, ReLU, 2x2 max-pool),
    as in the authors' ``LeNet`` (k = 1 is LeCun et al.'s layout: 16*5*5 -> 120 on 32x32 input).
    """
    if width < 1:
        raise ValueError(f"lenet width must be a positive integer, got {width}")
    height, breadth = _pooled_size(input_shape, 0, "LeNet")
    k, p = width, parameterization
    return nn.Sequential(
        conv2d(input_shape[0], 6 * k, 5, 0, p),
        nn.ReLU(),
        nn.MaxPool2d(2),
        conv2d(6 * k, 16 * k, 5, 0, p),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        linear(16 * k * height * breadth, 120 * k, p),
        nn.ReLU(),
        linear(120 * k, 84 * k, p),
        nn.ReLU(),
        linear(84 * k, num_classes, p),
    )


def build_model(
    kind: str,
    input_shape: Sequence[int],
    num_classes: int,
    parameterization: Kind = "pytorch",
    weight_var: float | None = None,
    bias_var: float | None = None,
    **options,
) -> nn.Module:
    """The model ``kind`` with ``num_classes`` outputs, its layers in the given parameterisation
    (variances default to Jian & Liu's sigma_w^2 = 1.5, sigma_b^2 = 0.01)."""
    builders = {"logreg": logistic_regression, "mlp": mlp, "cnn": cnn, "lenet": lenet}
    if kind not in builders:
        raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(builders)}")
    p = Parameterization(
        parameterization,
        WEIGHT_VAR if weight_var is None else weight_var,
        BIAS_VAR if bias_var is None else bias_var,
    )
    return builders[kind](input_shape, num_classes, parameterization=p, **options)

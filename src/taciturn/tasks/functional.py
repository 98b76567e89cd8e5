"""A fast pure forward pass for plain ``nn.Sequential`` models.

``torch.func.functional_call`` swaps a module's parameters in and out on every call, which costs
about as much as the arithmetic of a small MLP step. For a Sequential of the layers our models use
(Flatten, Linear, ReLU, Conv2d, MaxPool2d) the same forward pass is a short list of ``torch.nn.
functional`` calls reading the parameters straight from the dict: identical arithmetic, no
swapping, and still a pure function that ``vmap`` and ``grad`` accept. Other models return None
and keep using functional_call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from taciturn.core.params import Params
from taciturn.tasks.layers import ScaledConv2d, ScaledLinear

Layer = Callable[[Params, torch.Tensor], torch.Tensor]


def _layer(name: str, module: nn.Module) -> Layer | None:
    if isinstance(module, nn.Flatten):
        start, end = module.start_dim, module.end_dim
        return lambda p, x: x.flatten(start, end)
    if isinstance(module, nn.ReLU):
        return lambda p, x: F.relu(x)
    if isinstance(module, ScaledLinear):  # standard/NTK parameterisation (tasks/layers.py)
        w, b, ws, bs = f"{name}.weight", f"{name}.bias", module.weight_scale, module.bias_scale
        return lambda p, x: F.linear(x, p[w]) * ws + p[b] * bs
    if isinstance(module, ScaledConv2d):
        return None
    if isinstance(module, nn.Linear):
        w, b = f"{name}.weight", f"{name}.bias" if module.bias is not None else None
        return lambda p, x: F.linear(x, p[w], p[b] if b else None)
    if isinstance(module, nn.Conv2d) and module.padding_mode == "zeros" and isinstance(module.padding, tuple):
        w, b = f"{name}.weight", f"{name}.bias" if module.bias is not None else None
        stride, padding, dilation, groups = module.stride, module.padding, module.dilation, module.groups
        return lambda p, x: F.conv2d(x, p[w], p[b] if b else None, stride, padding, dilation, groups)
    if isinstance(module, nn.MaxPool2d) and not module.return_indices:
        k, s, pad, d, ceil = (
            module.kernel_size,
            module.stride,
            module.padding,
            module.dilation,
            module.ceil_mode,
        )
        return lambda p, x: F.max_pool2d(x, k, s, pad, d, ceil)
    return None


def sequential_forward(model: nn.Module) -> Callable[[Params, torch.Tensor], torch.Tensor] | None:
    """A pure forward(params, x) for a Sequential of known layers, else None."""
    if not isinstance(model, nn.Sequential):
        return None
    layers = [_layer(name, module) for name, module in model.named_children()]
    if any(layer is None for layer in layers):
        return None

    def forward(params: Params, x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            x = layer(params, x)
        return x

    return forward


def mlp_layers(model: nn.Module) -> list[tuple[str, str | None]] | None:
    """(weight, bias) names of a Sequential [Flatten], Linear, ReLU, ..., Linear, else None."""
    if not isinstance(model, nn.Sequential):
        return None
    children = list(model.named_children())
    if children and isinstance(children[0][1], nn.Flatten):
        children = children[1:]
    if len(children) % 2 == 0:
        return None
    layers = []
    for i, (name, module) in enumerate(children):
        wanted = nn.Linear if i % 2 == 0 else nn.ReLU
        if type(module) is not wanted:  # exactly: a scaled subclass multiplies its output
            return None
        if wanted is nn.Linear:
            layers.append((f"{name}.weight", f"{name}.bias" if module.bias is not None else None))
    return layers

"""Dense and convolutional layers under three parameterisations, chosen by ``Parameterization``.

* ``pytorch``: ``nn.Linear`` / ``nn.Conv2d`` with PyTorch's default initialisation.
* ``standard``: W ~ N(0, sigma_w^2 / fan_in), b ~ N(0, sigma_b^2), layer x -> W x + b
  (the "standard parameterization" of Lee et al., "Wide Neural Networks of Any Depth Evolve as
  Linear Models Under Gradient Descent", NeurIPS 2019, Sec. 2).
* ``ntk``: W ~ N(0, 1), b ~ N(0, 1), layer x -> (sigma_w / sqrt(fan_in)) W x + sigma_b b
  (Jacot, Gabriel, Hongler, "Neural Tangent Kernel", NeurIPS 2018; Lee et al. 2019, Eq. 1).
  Both give the same function at initialisation, but under the NTK parameterisation a fixed
  learning rate eta_0 trains every width on the same time scale, which is the regime in which
  Jian & Liu (ICML 2025) state their theorems ("NTK scaling" with eta = eta_0 / n in the standard
  parameterisation is the same dynamics for the hidden layers).

The scale factors live on the layer (``weight_scale``, ``bias_scale``) so that analysis tools
(tasks/ntk.py) can use the closed form of a dense layer's tangent kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Kind = Literal["pytorch", "standard", "ntk"]
WEIGHT_VAR, BIAS_VAR = 1.5, 0.01  # sigma_w^2 and sigma_b^2 of Jian & Liu's code (model.py)


@dataclass(frozen=True)
class Parameterization:
    kind: Kind = "pytorch"
    weight_var: float = WEIGHT_VAR  # sigma_w^2
    bias_var: float = BIAS_VAR  # sigma_b^2

    def __post_init__(self) -> None:
        if self.kind not in ("pytorch", "standard", "ntk"):
            raise ValueError(f"unknown parameterization {self.kind!r}; choose pytorch, standard or ntk")
        if self.weight_var <= 0 or self.bias_var < 0:
            raise ValueError(f"need weight_var > 0 and bias_var >= 0, got {self.weight_var}, {self.bias_var}")

    def scales_and_stds(self, fan_in: int) -> tuple[float, float, float, float]:
        """(weight_scale, bias_scale, weight_std, bias_std) of a layer with ``fan_in`` inputs."""
        sigma_w, sigma_b = math.sqrt(self.weight_var / fan_in), math.sqrt(self.bias_var)
        if self.kind == "ntk":
            return sigma_w, sigma_b, 1.0, 1.0
        # The authors' code (model.py) draws every layer's weights with std sqrt(1.5 / n), n the
        # hidden width, also the first layer's (fan-in 784); we divide by each layer's fan-in, as
        # the parameterisations of Lee et al. (2019, Eq. 1) that the paper's theory builds on do.
        return 1.0, 1.0, sigma_w, sigma_b


PYTORCH = Parameterization("pytorch")


class _Scaled:
    """Shared init of the scaled layers: N(0, std^2) parameters, forward-pass scale factors."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def _setup(self, p: Parameterization, fan_in: int) -> None:
        self.weight_scale, self.bias_scale, self.weight_std, self.bias_std = p.scales_and_stds(fan_in)

    def reset_parameters(self) -> None:
        if not hasattr(self, "weight_std"):  # nn.Linear.__init__ calls this before _setup has run
            return
        nn.init.normal_(self.weight, 0.0, self.weight_std)
        if self.bias is not None:
            nn.init.normal_(self.bias, 0.0, self.bias_std)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, weight_scale={self.weight_scale:.4g}, bias_scale={self.bias_scale:.4g}"
        )


class ScaledLinear(_Scaled, nn.Linear):
    def __init__(self, fan_in: int, fan_out: int, p: Parameterization):
        nn.Linear.__init__(self, fan_in, fan_out)
        self._setup(p, fan_in)
        self.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Scaling the output rather than the weight: the same function, without a copy of W per call.
        return F.linear(x, self.weight) * self.weight_scale + self.bias * self.bias_scale


class ScaledConv2d(_Scaled, nn.Conv2d):
    def __init__(self, in_channels: int, out_channels: int, kernel: int, padding: int, p: Parameterization):
        nn.Conv2d.__init__(self, in_channels, out_channels, kernel, padding=padding)
        self._setup(p, in_channels * kernel * kernel)
        self.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._conv_forward(x, self.weight, None) * self.weight_scale
        return out + (self.bias * self.bias_scale).view(1, -1, 1, 1)


def linear(fan_in: int, fan_out: int, p: Parameterization | None = None) -> nn.Linear:
    p = p or PYTORCH
    return nn.Linear(fan_in, fan_out) if p.kind == "pytorch" else ScaledLinear(fan_in, fan_out, p)


def conv2d(in_channels: int, out_channels: int, kernel: int, padding: int, p: Parameterization | None = None):
    p = p or PYTORCH
    if p.kind == "pytorch":
        return nn.Conv2d(in_channels, out_channels, kernel, padding=padding)
    return ScaledConv2d(in_channels, out_channels, kernel, padding, p)


def effective_scales(model: nn.Module) -> dict[str, float]:
    """Parameter name -> the factor the forward pass multiplies it by (1 outside scaled layers).

    Scaled parameters times these factors are the *effective* weights, the network's weights in
    the standard parameterisation's coordinates, whatever parameterisation the model uses.
    """
    scales = dict.fromkeys((name for name, _ in model.named_parameters()), 1.0)
    for name, module in model.named_modules():
        if isinstance(module, _Scaled):
            scales[f"{name}.weight"] = module.weight_scale
            if module.bias is not None:
                scales[f"{name}.bias"] = module.bias_scale
    return scales

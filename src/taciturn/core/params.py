"""Operations on parameter dictionaries (name -> tensor), the currency between algorithm steps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

Params = dict[str, torch.Tensor]


def clone(p: Mapping[str, torch.Tensor]) -> Params:
    return {k: v.detach().clone() for k, v in p.items()}


def zeros_like(p: Mapping[str, torch.Tensor]) -> Params:
    return {k: torch.zeros_like(v) for k, v in p.items()}


def sub(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> Params:
    return {k: a[k] - b[k] for k in a}


def add(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], scale: float = 1.0) -> Params:
    """a + scale * b"""
    return {k: a[k] + scale * b[k] for k in a}


def weighted_sum(items: Iterable[tuple[float, Mapping[str, torch.Tensor]]]) -> Params | None:
    """sum_i w_i p_i as a running sum, so memory does not grow with the number of terms."""
    total: Params | None = None
    for weight, p in items:
        if total is None:
            total = {k: weight * v for k, v in p.items()}
        else:
            for k, v in p.items():
                total[k].add_(v, alpha=weight)
    return total


def sq_norm(p: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Squared Euclidean norm of all tensors concatenated."""
    return sum((v.pow(2).sum() for v in p.values()), torch.zeros(()))


def sq_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """||a - b||^2 over all tensors (differentiable in a and b)."""
    return sum(((a[k] - b[k]).pow(2).sum() for k in a), torch.zeros(()))


def dot(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """<a, b> over all tensors (differentiable)."""
    return sum(((a[k] * b[k]).sum() for k in a), torch.zeros(()))


def norm(p: Mapping[str, torch.Tensor]) -> float:
    return float(sq_norm(p).sqrt())


def flatten(p: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in p.values()])


def with_prefix(prefix: str, p: Mapping[str, torch.Tensor]) -> Params:
    """Name tensors '<prefix>/<name>' so several parameter sets share one state dict."""
    return {f"{prefix}/{k}": v for k, v in p.items()}


def strip_prefix(prefix: str, state: Mapping[str, torch.Tensor]) -> Params:
    """The tensors named '<prefix>/<name>', as {name: tensor}."""
    head = prefix + "/"
    return {k[len(head) :]: v for k, v in state.items() if k.startswith(head)}


def num_elements(p: Mapping[str, torch.Tensor]) -> int:
    return sum(v.numel() for v in p.values())

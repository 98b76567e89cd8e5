"""Config tables' common rules (every algorithm's and the run's tables are StrictModels)."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, model_validator

MAX_LR = 1e6  # larger learning rates or decays are typos (1e308 passes as finite, then overflows)


class StrictModel(BaseModel):
    """Config tables: unknown keys rejected, every float finite (inf and NaN refused), and numbers
    must be numbers: a string ("10") or a boolean (true) where an integer or float goes is an error,
    not coerced. (pydantic's own strict mode would also refuse TOML arrays for tuples.)"""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, tree: Any) -> Any:
        if isinstance(tree, dict):
            for name, f in cls.model_fields.items():
                value = tree.get(name)
                if _numeric(f.annotation, False):
                    items = [value]
                elif isinstance(value, list | tuple) and _numeric(f.annotation, True):
                    items = value
                else:
                    continue
                for item in items:
                    if isinstance(item, bool | str):
                        raise ValueError(f"{name} must be a number, not {type(item).__name__} {item!r}")
        return tree


def _numeric(annotation: Any, in_tuple: bool) -> bool:
    """Whether a field holds only numbers (``in_tuple``: a tuple of only numbers), None aside."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(_numeric(a, in_tuple) for a in args)
    if in_tuple:
        args = typing.get_args(annotation)
        return origin is tuple and bool(args) and all(_numeric(a, False) for a in args if a is not Ellipsis)
    return annotation in (int, float)

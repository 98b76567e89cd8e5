"""Plugins named in a config by import path: ``model.factory = "package.module:callable"``.

The string is resolved before any work starts; when it does not resolve, the error says what was
tried (the module, the attribute, the folders searched) and how to fix it. The working directory
is searched too, as ``python -m`` would, so a ``models.py`` beside the config just works.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from taciturn.experiments.config import ConfigError


def load_callable(path: str, key: str) -> Callable[..., Any]:
    """The callable ``path`` ("package.module:attribute.attribute") names; ``key`` is the config key."""
    module_name, _, attribute = path.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ConfigError(
            f"[{key}] cannot import {module_name!r} (from {path!r}): {error}; searched the working "
            f"directory {os.getcwd()} and the installed packages: install the package or run from the "
            "folder that holds it"
        ) from None
    except Exception as error:  # the user's module raised while importing
        raise ConfigError(
            f"[{key}] importing {module_name!r} (from {path!r}) failed: {type(error).__name__}: {error}"
        ) from None
    target: Any = module
    for depth, part in enumerate(attribute.split(".")):
        if not hasattr(target, part):
            owner = ".".join([module_name, *attribute.split(".")[:depth]])
            names = [n for n in dir(target) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"it has: {', '.join(names[:12]) or 'nothing'}"
            raise ConfigError(f"[{key}] {owner!r} has no attribute {part!r} (from {path!r}): {hint}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"[{key}] {path!r} is a {type(target).__name__}, not a callable")
    return target

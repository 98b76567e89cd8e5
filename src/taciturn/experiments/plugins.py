"""Plugins named in a config by import path: ``model.factory = "package.module:callable"``.

The string is resolved before any work starts; when it does not resolve, the error says what was
tried (the module, the attribute, the folders searched) and how to fix it. The working directory
is searched too, as ``python -m`` would, so a ``models.py`` beside the config just works.

Importing is running code, so it is refused where the config may not be the user's: `taciturn
report` and `compare` never import anything (``no_code``), and `resume` and `export` of a folder
import only if this user's taciturn wrote it (its manifest's MAC checks, report/manifest.py) or the
user says so (``--trust-code``, ``trust_code=True``, as Hugging Face's ``trust_remote_code``).
Every import goes through ``load_callable``, which checks this.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from taciturn.experiments.config import IMPORT_PATH, ConfigError

# Why importing is refused right now (None: allowed); set by ``no_code`` and ``trusted``.
_refusal: contextvars.ContextVar[str | None] = contextvars.ContextVar("taciturn_code_refusal", default=None)


class UntrustedCode(ConfigError):
    """A run folder's config names code to import, and nothing says the folder is the user's."""


@contextlib.contextmanager
def no_code(reason: str) -> Iterator[None]:
    """Within this block every import a config names is refused, with ``reason``."""
    token = _refusal.set(reason)
    try:
        yield
    finally:
        _refusal.reset(token)


def named_code(tree: Any, where: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Every (key, "package.module:callable") a config tree names to import (model.factory,
    data.factory, a loss, or any other import path), except under free-text names and kwargs."""
    found: list[tuple[str, str]] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            if str(key) not in ("name", "kwargs"):
                found += named_code(value, (*where, str(key)))
    elif isinstance(tree, list | tuple):
        for value in tree:
            found += named_code(value, where)
    elif isinstance(tree, str) and re.match(IMPORT_PATH, tree):
        found.append((".".join(where), tree))
    return found


@contextlib.contextmanager
def trusted(rundir: Any, tree: dict, trust_code: bool, what: str) -> Iterator[None]:
    """Allow the imports the run folder's config names only if ``trust_code`` or this user's
    taciturn wrote the folder (``rundir.signed()``); otherwise refuse before anything is touched,
    and refuse any import at all within the block."""
    if trust_code or rundir.signed():
        yield
        return
    code = named_code(tree)
    listed = ", ".join(f"{key} = {path!r}" for key, path in code[:3]) or "code"
    reason = (
        f"{rundir.config} names code to import ({listed}), and {rundir.path} was not written by "
        "taciturn run by you on this machine (its manifest.json carries no MAC made with your key: the "
        f"folder came from elsewhere, or was edited). Read that code first; then {what} with "
        "--trust-code (trust_code=True in Python) to run it"
    )
    if code:
        raise UntrustedCode(reason)
    with no_code(reason):
        yield


def load_callable(path: str, key: str) -> Callable[..., Any]:
    """The callable ``path`` ("package.module:attribute.attribute") names; ``key`` is the config key."""
    if (refused := _refusal.get()) is not None:
        raise UntrustedCode(f"[{key}] {path!r} is not imported: {refused}")
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

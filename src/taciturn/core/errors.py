"""The root of taciturn's error types: one per layer, each with a message that says what is wrong
and what to do. The CLI prints any ``TaciturnError`` without a traceback and exits non-zero;
anything else escaping for bad input is a bug.

Layers define their own subclass where they live (core/codec.py ``CodecError``,
experiments/config.py ``ConfigError``, data ``DataError``, report/rundir.py ``RunDirError`` ...),
so imports keep pointing downward.
"""

from __future__ import annotations


class TaciturnError(Exception):
    """Bad input or an unusable file, explained: the message names the thing and the fix."""

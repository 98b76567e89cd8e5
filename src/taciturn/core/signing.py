"""This user's key on this machine, and the MACs that say "taciturn, run by me here, wrote this".

A run folder names code to import (``model.factory = "pkg.mod:fn"``), so a folder received from
someone else must not run it unless the user says so. A folder this user's taciturn wrote carries
an HMAC-SHA256 (Python's ``hmac``; the key from ``os.urandom``) of its manifest, made with a key kept
in the user's own config directory: anyone can recompute a SHA-256 digest after editing a file,
nobody without the key can recompute the MAC. The key lives in ``$TACITURN_KEY_DIR`` if set (the
tests point it at a temporary folder), else ``$XDG_CONFIG_HOME/taciturn``, else
``~/.config/taciturn``; it is made on first use, readable by its owner only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

from taciturn.core.errors import TaciturnError

KEY_FILE = "key"
KEY_BYTES = 32


class KeyFileError(TaciturnError, OSError):
    """The key file exists but cannot be trusted (another owner, readable by others, wrong size)."""


def key_dir() -> Path:
    if explicit := os.environ.get("TACITURN_KEY_DIR"):
        return Path(explicit)
    config = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config) / "taciturn"


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise KeyFileError(f"{path} is not a file of this user; remove it and taciturn makes a new key")
        if info.st_mode & 0o077:
            raise KeyFileError(
                f"{path} can be read by other users, so it proves nothing: `chmod 600 {path}`, or remove it "
                "(runs signed with it then need --trust-code once)"
            )
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise KeyFileError(f"{path} is not a taciturn key ({len(key)} bytes); remove it to make a new one")
    return key


def key(create: bool = True) -> bytes | None:
    """The key, made now (0600, from the OS's random source) if there is none and ``create``."""
    folder = key_dir()
    path = folder / KEY_FILE
    try:
        return _read(path)
    except FileNotFoundError:
        if not create:
            return None
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:  # another process made it meanwhile
        return _read(path)
    try:
        os.write(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    return _read(path)


def mac(data: bytes) -> str:
    """HMAC-SHA256 of ``data`` with this user's key (made if there is none yet)."""
    secret = key(create=True)
    assert secret is not None
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def verify(data: bytes, tag: object) -> bool:
    """Whether ``tag`` is this user's MAC of ``data`` (False without a key or with a foreign tag)."""
    if not isinstance(tag, str):
        return False
    try:
        secret = key(create=False)
    except KeyFileError:
        return False
    if secret is None:
        return False
    return hmac.compare_digest(hmac.new(secret, data, hashlib.sha256).hexdigest(), tag)

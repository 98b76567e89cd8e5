"""Files inside a folder taciturn writes, opened without ever following a link out of it.

A run folder may come from someone else (a tarball, a shared drive) or be changed while taciturn
is away: ``client_state.bin -> ~/x.db`` or ``plots -> ~/Pictures`` must not make taciturn truncate,
write or delete the user's files. So every path below a folder is opened one component at a time,
relative to the descriptor of the folder above it, with ``O_NOFOLLOW``: a link (or a FIFO, a
device, a folder where a file belongs) where taciturn expects its own file or folder is a
``FolderError`` that names it, never a way out. The folder itself, the path the user named, may
be reached through links: that was the user's choice.

A file opened for writing must also have one name only (a hard link would carry the write to
the other name). Disk-full errors name the file. ``owner``, when given, is told the relative
path of every file or folder before it is created and of every existing file before it is
written: the run's manifest (report/manifest.py) lists what taciturn wrote before it exists, so
``--overwrite`` deletes exactly that, and a file it does not list is never written over.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

from taciturn.core.errors import TaciturnError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FULL = (errno.ENOSPC, errno.EDQUOT)


class Owner(Protocol):
    """Who keeps account of a folder's files (a run's manifest, report/rundir.py)."""

    def creating(self, rel: str, is_dir: bool) -> None:
        """Told before ``rel`` is created (a file, or a folder)."""

    def writing(self, rel: str) -> None:
        """Told before the existing file ``rel`` is written; raises if it is not the owner's."""

    def written(self, rel: str, data: bytes) -> None:
        """Told after the whole file ``rel`` was written with ``data`` (its contents are now the owner's)."""


@dataclass(frozen=True)
class _Below:
    """An owner seen from a folder below its own: paths get the folder's prefix."""

    owner: Owner
    prefix: str

    def creating(self, rel: str, is_dir: bool) -> None:
        self.owner.creating(f"{self.prefix}/{rel}", is_dir)

    def writing(self, rel: str) -> None:
        self.owner.writing(f"{self.prefix}/{rel}")

    def written(self, rel: str, data: bytes) -> None:
        self.owner.written(f"{self.prefix}/{rel}", data)


class FolderError(TaciturnError, OSError):
    """A path inside a taciturn folder that taciturn will not use: a link, not a regular file,
    a name that leaves the folder, or a write the disk had no room for."""


def relative_parts(rel: str | PurePosixPath) -> list[str]:
    """The components of a path inside a folder; one that could leave it ('..', absolute) is refused."""
    text = str(rel)
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if text.startswith("/") or "\x00" in text or any(p == ".." for p in parts):
        raise FolderError(f"{text!r} is not a path inside the folder")
    return parts


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "other"


class Folder:
    """A folder, and every file and folder below it, used without following links."""

    def __init__(self, path: Path | str, fd: int | None = None, owner: Owner | None = None):
        self.path = Path(path)
        self._fd = fd
        self._owned = fd is None
        self.owner = owner

    # ----- the folder's own descriptor -----
    @property
    def fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self._fd

    def close(self) -> None:
        if self._owned and self._fd is not None:
            os.close(self._fd)
        self._fd = None

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def rel(self, target: Path | str) -> str:
        """``target`` as a POSIX path relative to this folder: a string is one already, a Path is
        one under this folder's path."""
        if isinstance(target, str):
            return "/".join(relative_parts(target))
        try:
            inside = Path(os.path.abspath(target)).relative_to(os.path.abspath(self.path))
        except ValueError:
            raise FolderError(f"{target} is not inside {self.path}") from None
        return "/".join(relative_parts(inside.as_posix()))

    def where(self, rel: str) -> Path:
        return self.path / rel if rel else self.path

    # ----- walking without links -----
    def _describe(self, rel: str, kind: str | None, wanted: str) -> FolderError:
        where = self.where(rel)
        if kind == "link":
            return FolderError(
                f"{where} is a symbolic link; taciturn never follows a link out of a run folder: remove "
                f"the link (a folder from someone else may hold one) or put the real {wanted} there"
            )
        if kind == "dir":
            return FolderError(f"{where} is a folder where taciturn keeps a {wanted}; move it away")
        if kind == "file":
            return FolderError(f"{where} is a file where taciturn keeps a {wanted}; move it away")
        return FolderError(f"{where} is not a regular {wanted} (a FIFO, socket or device); remove it")

    def _lkind(self, dir_fd: int, name: str) -> str | None:
        try:
            return _kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return None

    def _dir_fd(self, parts: list[str], create: bool) -> int:
        """A new descriptor of the folder ``parts`` below this one (made when ``create``)."""
        fd = os.dup(self.fd)
        try:
            for depth, name in enumerate(parts):
                rel = "/".join(parts[: depth + 1])
                kind = self._lkind(fd, name)
                if kind is None:
                    if not create:
                        raise FileNotFoundError(
                            errno.ENOENT, "No such file or directory", str(self.where(rel))
                        )
                    if self.owner is not None:
                        self.owner.creating(rel, True)
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o755, dir_fd=fd)
                    kind = self._lkind(fd, name)
                if kind != "dir":
                    raise self._describe(rel, kind, "folder")
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as error:
                    if error.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link meanwhile
                        raise self._describe(rel, "link", "folder") from None
                    raise
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    @contextlib.contextmanager
    def _parent(self, rel: str, create: bool = False) -> Iterator[tuple[int, str, str]]:
        parts = relative_parts(rel)
        if not parts:
            raise FolderError(f"{self.path}: a file name is needed")
        fd = self._dir_fd(parts[:-1], create)
        try:
            yield fd, parts[-1], "/".join(parts)
        finally:
            os.close(fd)

    # ----- questions -----
    def kind(self, rel: str = "") -> str | None:
        """'file', 'dir', 'link', 'other', or None when there is nothing (or no folder above it)."""
        parts = relative_parts(rel)
        if not parts:
            return "dir"
        try:
            fd = self._dir_fd(parts[:-1], create=False)
        except FileNotFoundError:
            return None
        try:
            return self._lkind(fd, parts[-1])
        finally:
            os.close(fd)

    def exists(self, rel: str) -> bool:
        return self.kind(rel) is not None

    def is_file(self, rel: str) -> bool:
        return self.kind(rel) == "file"

    def is_dir(self, rel: str) -> bool:
        return self.kind(rel) == "dir"

    def listdir(self, rel: str = "") -> list[str]:
        """The names in folder ``rel`` (sorted); a link there is an error."""
        fd = self._dir_fd(relative_parts(rel), create=False)
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def size(self, rel: str) -> int:
        with self._parent(rel) as (fd, name, rel):
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise self._describe(rel, _kind(info.st_mode), "file")
            return info.st_size

    # ----- opening files -----
    def open_fd(self, rel: str, flags: int, mode: int = 0o644) -> int:
        """A raw descriptor of regular file ``rel``; ``flags``: os.O_RDONLY, O_RDWR, O_WRONLY, plus
        O_CREAT, O_TRUNC, O_APPEND (truncation happens only once the file is known to be safe)."""
        writing = flags & (os.O_WRONLY | os.O_RDWR)
        with self._parent(rel, create=bool(flags & os.O_CREAT)) as (dir_fd, name, rel):
            kind = self._lkind(dir_fd, name)
            if kind not in (None, "file"):
                raise self._describe(rel, kind, "file")
            if self.owner is not None and writing:
                if kind is None and flags & os.O_CREAT:
                    self.owner.creating(rel, False)
                elif kind is not None:
                    self.owner.writing(rel)
            safe = (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            try:
                fd = os.open(name, safe, mode, dir_fd=dir_fd)
            except OSError as error:
                if error.errno == errno.ELOOP:
                    raise self._describe(rel, "link", "file") from None
                if error.errno == errno.ENXIO:
                    raise self._describe(rel, "other", "file") from None
                raise _named(error, self.where(rel)) from None
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise self._describe(rel, _kind(info.st_mode), "file")
                if writing and info.st_nlink > 1:
                    raise FolderError(
                        f"{self.where(rel)} has {info.st_nlink} names (hard links): writing it would change "
                        "the others too; replace it by a copy (cp) or remove it"
                    )
                os.set_blocking(fd, True)
                if flags & os.O_TRUNC:
                    os.ftruncate(fd, 0)
            except BaseException:
                os.close(fd)
                raise
            return fd

    @contextlib.contextmanager
    def open(self, rel: str, mode: str = "r", newline: str | None = None) -> Iterator[IO[Any]]:
        """The file ``rel`` as a Python file object: modes r, w, a, x, r+ (each with or without b).
        A disk-full error while writing it names it."""
        base = mode.replace("b", "").replace("t", "")
        flags = {
            "r": os.O_RDONLY,
            "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
            "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
            "r+": os.O_RDWR,
        }[base]
        fd = self.open_fd(rel, flags)
        binary = "b" in mode
        text = {} if binary else {"newline": newline, "encoding": "utf-8"}
        file = os.fdopen(fd, mode.replace("x", "w"), **text)
        where = self.where(self.rel(rel))
        try:
            yield file
            file.flush()
        except OSError as error:
            raise _named(error, where) from None
        finally:
            with contextlib.suppress(OSError):
                file.close()

    def read_bytes(self, rel: str) -> bytes:
        with self.open(rel, "rb") as f:
            return f.read()

    def read_text(self, rel: str) -> str:
        with self.open(rel, "r") as f:
            return f.read()

    def write_bytes(self, rel: str, data: bytes, sync: bool = False) -> None:
        with self.open(rel, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        if self.owner is not None:
            self.owner.written(self.rel(rel), data)

    def write_text(self, rel: str, text: str, sync: bool = False) -> None:
        self.write_bytes(rel, text.encode(), sync)

    def append_text(self, rel: str, text: str) -> None:
        with self.open(rel, "a") as f:
            f.write(text)

    def text_stream(self, rel: str) -> io.TextIOWrapper:
        """``rel`` opened for appending, kept open by the caller (a log handler)."""
        return os.fdopen(self.open_fd(rel, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a", encoding="utf-8")

    def digest(self, rel: str, size: int | None = None) -> str:
        """SHA-256 of the file, or of its first ``size`` bytes."""
        h = hashlib.sha256()
        with self.open(rel, "rb") as f:
            left = os.fstat(f.fileno()).st_size if size is None else size
            while left > 0 and (chunk := f.read(min(left, 1 << 20))):
                h.update(chunk)
                left -= len(chunk)
        return h.hexdigest()

    def fsync(self, rel: str) -> None:
        with self.open(rel, "rb") as f:
            os.fsync(f.fileno())

    def truncate(self, rel: str, size: int) -> None:
        with self.open(rel, "r+b") as f:
            f.truncate(size)
            os.fsync(f.fileno())

    # ----- folders -----
    def mkdir(self, rel: str) -> None:
        """Make folder ``rel`` (and those above it) unless it is there; a link there is an error."""
        os.close(self._dir_fd(relative_parts(rel), create=True))

    def sub(self, rel: str, create: bool = False) -> Folder:
        """The folder ``rel`` as a Folder of its own (close it, or use it in a with block)."""
        fd = self._dir_fd(relative_parts(rel), create)
        below = None if self.owner is None else _Below(self.owner, "/".join(relative_parts(rel)))
        folder = Folder(self.where(rel), fd, below)
        folder._owned = True
        return folder

    def fsync_dir(self, rel: str = "") -> None:
        fd = self._dir_fd(relative_parts(rel), create=False)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ----- removing and renaming (never through a link, never a folder's contents wholesale) -----
    def unlink(self, rel: str, missing_ok: bool = True) -> bool:
        """Remove regular file ``rel``; a link or anything else there is an error. True if removed."""
        try:
            with self._parent(rel) as (fd, name, rel):
                kind = self._lkind(fd, name)
                if kind is None:
                    if missing_ok:
                        return False
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(self.where(rel)))
                if kind != "file":
                    raise self._describe(rel, kind, "file")
                os.unlink(name, dir_fd=fd)
                return True
        except FileNotFoundError:
            if missing_ok:
                return False
            raise

    def rmdir(self, rel: str) -> bool:
        """Remove folder ``rel`` if it is empty (a link there is an error); True if removed."""
        try:
            with self._parent(rel) as (fd, name, rel):
                kind = self._lkind(fd, name)
                if kind is None:
                    return False
                if kind != "dir":
                    raise self._describe(rel, kind, "folder")
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError as error:
                    if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        return False
                    raise
                return True
        except FileNotFoundError:
            return False

    def rename(self, source: str, target: str) -> None:
        """Rename ``source`` to ``target`` (replacing a file or an empty folder there, never a link)."""
        with (
            self._parent(source) as (src_fd, src_name, source),
            self._parent(target) as (
                dst_fd,
                dst_name,
                target,
            ),
        ):
            for rel, fd, name in ((source, src_fd, src_name), (target, dst_fd, dst_name)):
                if self._lkind(fd, name) in ("link", "other"):
                    raise self._describe(rel, self._lkind(fd, name), "file")
            os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def _named(error: OSError, where: Path) -> OSError:
    """A disk-full error as a FolderError naming the file; another OSError given its file name."""
    if error.errno in _FULL:
        return FolderError(
            f"no space left on the disk while writing {where}: free some space, then `taciturn resume` "
            "the run (its last checkpoint is intact)"
        )
    if error.filename is None:
        return OSError(error.errno, error.strerror, str(where))
    return error


def as_folder(where: Path | str | Folder) -> Folder:
    """``where`` as a Folder; a path names the folder (made if missing) that the caller chose."""
    if isinstance(where, Folder):
        return where
    Path(where).mkdir(parents=True, exist_ok=True)
    return Folder(where)

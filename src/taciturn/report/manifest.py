"""A run folder's manifest: what taciturn wrote there, the digests to check it by, and who wrote it.

``manifest.json`` at the top of a run folder lists every file and folder taciturn made in it
(checkpoints and plots included), each file entered before it is created, so that ``--overwrite``
deletes exactly these and nothing a user put beside them. Files whose contents matter carry their
SHA-256 and length: whole files as written, appended files (metrics, ledger, events) as of the last
checkpoint or the end of the run (run.log too), scratch files (a disk store's slots) as of the end of
the run. ``report`` checks the files it reads against it and names any that changed; ``--overwrite``
deletes none that changed since (it may be the user's work now), nor does any run write over one.

The manifest also carries an HMAC-SHA256 made with this user's key (core/signing.py) when this
user's taciturn wrote the run: a folder edited or received from someone else has none that checks,
so the code its config names (``model.factory``) is not run without ``--trust-code``. A process that
changes a folder whose MAC did not check never signs it: trust is not laundered by a report.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from taciturn.core import signing
from taciturn.core.folder import Folder, FolderError, relative_parts

NAME = "manifest.json"
FORMAT = "taciturn-run-manifest/1"


class ManifestError(FolderError):
    """A manifest.json that is not taciturn's, or files that do not match it."""


@dataclass
class Manifest:
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> {sha256, bytes, appended}
    folders: set[str] = field(default_factory=set)
    complete: bool = False  # the run ended; False while it is written (or after a crash)
    signed: bool = True  # sign when saving: this user's taciturn wrote the folder
    mac_valid: bool = False  # the MAC it was loaded with checked with this user's key

    def body(self) -> bytes:
        tree = {
            "format": FORMAT,
            "files": self.files,
            "folders": sorted(self.folders),
            "complete": self.complete,
        }
        return json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()

    # ----- reading and writing manifest.json -----
    @classmethod
    def load(cls, fs: Folder) -> Manifest | None:
        """The folder's manifest, or None if it has none; one that is not taciturn's is an error."""
        kind = fs.kind(NAME)
        if kind is None:
            return None
        where = fs.where(NAME)
        try:
            tree = json.loads(fs.read_text(NAME))
            if not isinstance(tree, dict) or tree.get("format") != FORMAT:
                raise ValueError("it has no taciturn format marker")
            files = {str(k): dict(v) for k, v in tree["files"].items()}
            folders = {str(f) for f in tree["folders"]}
            for name in (*files, *folders):
                relative_parts(name)
            manifest = cls(files, folders, bool(tree["complete"]), signed=False)
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, FolderError) as error:
            raise ManifestError(
                f"{where} is not a taciturn manifest ({type(error).__name__}: {error}); it is damaged, "
                "or not taciturn's: move it away, or use another folder"
            ) from None
        manifest.mac_valid = manifest.signed = signing.verify(manifest.body(), tree.get("mac"))
        return manifest

    def save(self, fs: Folder, sync: bool = False) -> None:
        """Write manifest.json atomically (a temporary, then a rename), with the MAC if signed."""
        tree = json.loads(self.body())
        if self.signed:
            tree["mac"] = signing.mac(self.body())
        fs.write_text(NAME + ".tmp", json.dumps(tree, indent=1, sort_keys=True), sync=sync)
        fs.rename(NAME + ".tmp", NAME)
        if sync:
            fs.fsync_dir()

    # ----- entries -----
    def add(self, rel: str, is_dir: bool) -> bool:
        """Enter a path taciturn is about to create; False if it was listed already."""
        if is_dir:
            new = rel not in self.folders
            self.folders.add(rel)
        else:
            new = rel not in self.files
            self.files.setdefault(rel, {})
        return new

    def record(self, fs: Folder, rel: str, kind: str | None = None, data: bytes | None = None) -> None:
        """Enter the file's digest and length as they are now (``data``: its whole contents, when the
        caller just wrote them); ``kind``: "appended" (a file a run appends to, that may grow past
        them while it runs) or "scratch" (rewritten while it runs, checked only once it has ended)."""
        if data is None:
            entry = {"sha256": fs.digest(rel), "bytes": fs.size(rel)}
        else:
            entry = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        self.files[rel] = entry | ({kind: True} if kind else {})

    def set_appended(self, rel: str, size: int, digest: str) -> None:
        self.files[rel] = {"sha256": digest, "bytes": size, "appended": True}

    def lists(self, rel: str) -> bool:
        return rel in self.files or rel in self.folders

    def under(self, rel: str) -> tuple[list[str], list[str]]:
        """The files and folders listed at or below ``rel``."""
        prefix = rel + "/"
        files = [f for f in self.files if f.startswith(prefix)]
        folders = [f for f in self.folders if f == rel or f.startswith(prefix)]
        return files, folders

    def move(self, source: str, target: str) -> None:
        """Rename every entry at or below ``source`` (a folder renamed into place)."""
        files, folders = self.under(source)
        for f in files:
            self.files[target + f[len(source) :]] = self.files.pop(f)
        for f in folders:
            self.folders.discard(f)
            self.folders.add(target + f[len(source) :])

    def forget(self, rel: str) -> None:
        self.files.pop(rel, None)
        self.folders.discard(rel)

    def changed(self, fs: Folder, rel: str) -> bool:
        """Whether file ``rel``, listed with a digest, no longer holds what taciturn wrote (an
        appended file of a run that did not end may have grown past it)."""
        entry = self.files.get(rel, {})
        if "sha256" not in entry or fs.kind(rel) != "file" or (entry.get("scratch") and not self.complete):
            return False
        size, wanted = fs.size(rel), int(entry["bytes"])
        grew = entry.get("appended") and not self.complete and size > wanted
        return (size != wanted and not grew) or fs.digest(rel, wanted) != entry["sha256"]

    # ----- checking -----
    def check(self, fs: Folder, names: list[str]) -> None:
        """The files ``names`` that exist are listed, and each file listed there with a digest is
        unchanged (an appended file of a run that did not end may have grown past it)."""
        for rel in names:
            kind = fs.kind(rel)
            entry = self.files.get(rel)
            if kind is not None and entry is None:
                raise ManifestError(
                    f"{fs.where(rel)} is not listed in {fs.where(NAME)}: taciturn did not write it "
                    "there; remove it, or restore the run"
                )
            if entry is None or "sha256" not in entry:
                continue
            if kind is None:
                raise ManifestError(
                    f"{fs.where(rel)} is missing: {fs.where(NAME)} lists it as written by taciturn; "
                    "restore it, or run the experiment again"
                )
            if self.changed(fs, rel):
                raise ManifestError(
                    f"{fs.where(rel)} changed since taciturn wrote it (its length or SHA-256 is not the "
                    f"one in {fs.where(NAME)}): it was cut, edited or replaced; restore it, or run the "
                    "experiment again"
                )

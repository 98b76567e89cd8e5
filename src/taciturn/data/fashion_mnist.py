"""Fashion-MNIST (Xiao et al. 2017): 60,000 train and 10,000 test 28x28 grey images, 10 classes.

Sources, tried in order (the first that has all four IDX files wins):
  1. an explicit path (config ``data.path`` or ``taciturn data --path``): if given, the only one
     tried, so a wrong or damaged copy is an error, never a silent fallback to another copy;
  2. ``$TACITURN_DATA`` (the folder itself or its ``fashion-mnist`` subfolder);
  3. the download cache, ``$XDG_CACHE_HOME/taciturn/fashion-mnist``;
  4. Debian's ``dataset-fashion-mnist`` package, ``/usr/share/datasets/fashion-mnist``;
  5. a download of the official files into the cache (skipped when ``TACITURN_OFFLINE=1``).
Every file is checked against the SHA-256 of its *decompressed* IDX content, which is the same
for the official gzip files and Debian's re-compressed copies (Debian strips the gzip name and
timestamp, so the compressed bytes differ while the data does not). The decoded arrays are cached
as .npy and checked against the same digests each time they are read (the IDX header rebuilt in
front of the array's bytes), so an edited cache is decoded again, never trusted.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import struct
import tempfile
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import torch

from taciturn.core.paths import cache_root
from taciturn.data.datasets import ArrayDataset, DataError, DatasetNotFound

# SHA-256 of the decompressed IDX files.
FILES = {
    "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
OFFICIAL_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530  # of the training images scaled to [0, 1]
DOWNLOAD_TIMEOUT_S = 30


def cache_dir() -> Path:
    return cache_root() / "fashion-mnist"


def candidate_dirs(path: Path | None = None) -> list[tuple[str, Path]]:
    """(label, folder) pairs in the order they are tried (only the given path, if there is one)."""
    if path is not None:
        return [("given path", Path(path))]
    found: list[tuple[str, Path]] = []
    if env := os.environ.get("TACITURN_DATA"):
        found += [("$TACITURN_DATA", Path(env)), ("$TACITURN_DATA", Path(env) / "fashion-mnist")]
    found += [("download cache", cache_dir()), ("Debian dataset-fashion-mnist", DEBIAN_DIR)]
    return found


def _read_verified(file: Path) -> bytes:
    try:
        raw = gzip.decompress(file.read_bytes())
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise DataError(f"{file} is truncated or not a gzip file ({error}); download it again") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != FILES[file.name]:
        raise DataError(f"{file} has SHA-256 {digest} after decompression, expected {FILES[file.name]}")
    return raw


def _idx_header(array: np.ndarray) -> bytes:
    """The IDX header of a uint8 array (images: magic 2051 and three sizes; labels: 2049 and one)."""
    return struct.pack(">I" + "I" * array.ndim, 2051 if array.ndim == 3 else 2049, *array.shape)


def _cached(cache: Path, name: str) -> np.ndarray:
    """A decoded array from the cache, if it is exactly what the verified file decodes to."""
    array = np.load(cache / f"{name}.npy", allow_pickle=False)
    if array.dtype != np.uint8 or array.ndim not in (1, 3):
        raise ValueError(f"cached {name} is not a uint8 IDX array")
    if hashlib.sha256(_idx_header(array) + array.tobytes()).hexdigest() != FILES[name]:
        raise ValueError(f"cached {name} does not match its SHA-256")
    return array


def _parse_idx(raw: bytes, images: bool) -> np.ndarray:
    magic, count = struct.unpack(">II", raw[:8])
    if images:
        if magic != 2051:
            raise ValueError(f"not an IDX image file (magic {magic})")
        rows, cols = struct.unpack(">II", raw[8:16])
        return np.frombuffer(raw, np.uint8, offset=16).reshape(count, rows, cols).copy()
    if magic != 2049:
        raise ValueError(f"not an IDX label file (magic {magic})")
    return np.frombuffer(raw, np.uint8, offset=8).copy()


def _load_dir(folder: Path) -> dict[str, np.ndarray]:
    """The four files of ``folder`` as verified uint8 arrays.

    Decompressing 30 MB costs about a second, so the decoded arrays are cached (as .npy, no
    pickle) and reused while the source files keep their size and mtime and the arrays their digest.
    """
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"missing {', '.join(missing)}")
    stamp = {name: [(folder / name).stat().st_size, (folder / name).stat().st_mtime_ns] for name in FILES}
    cache = cache_dir() / "decoded" / hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    try:
        if json.loads((cache / "stamp.json").read_text()) == stamp:
            return {name: _cached(cache, name) for name in FILES}
    except (OSError, ValueError):
        pass  # no cache yet, or a broken or edited one: decode from the source
    arrays = {name: _parse_idx(_read_verified(folder / name), images="images" in name) for name in FILES}
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for name, array in arrays.items():
            np.save(cache / f"{name}.npy", array, allow_pickle=False)
        (cache / "stamp.json").write_text(json.dumps(stamp))  # written last: marks the cache complete
    except OSError:
        pass  # a read-only home only costs speed
    return arrays


def download(target: Path | None = None, base_url: str = OFFICIAL_URL) -> Path:
    """Download the four official files into ``target`` (default: the cache), verifying each."""
    target = Path(target or cache_dir())
    target.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (target / name).is_file():
            continue
        with tempfile.NamedTemporaryFile(dir=target, delete=False, suffix=".part") as tmp:
            part = Path(tmp.name)
            try:
                with urllib.request.urlopen(base_url + name, timeout=DOWNLOAD_TIMEOUT_S) as response:
                    shutil.copyfileobj(response, tmp)
            except Exception:
                part.unlink(missing_ok=True)
                raise
        try:
            _read_verified(part.rename(target / name))
        except Exception:
            (target / name).unlink(missing_ok=True)
            raise
    return target


def locate(path: Path | None = None, allow_download: bool | None = None) -> tuple[dict[str, np.ndarray], str]:
    """Find the verified arrays and describe where they came from, or raise DatasetNotFound."""
    tried = []
    for label, folder in candidate_dirs(path):
        try:
            return _load_dir(folder), f"{label}: {folder}"
        except (OSError, ValueError) as error:
            tried.append(f"{label} {folder}: {error}")
    if path is not None:
        raise DatasetNotFound(
            f"Fashion-MNIST is not usable at the given path {path}: {tried[0].split(': ', 1)[1]}. "
            "Fix that folder (the four IDX .gz files), or leave data.path unset to use the usual sources."
        )
    if allow_download is None:
        allow_download = os.environ.get("TACITURN_OFFLINE", "") in ("", "0")
    if allow_download:
        try:
            folder = download()
            return _load_dir(folder), f"downloaded from {OFFICIAL_URL} into {folder}"
        except Exception as error:  # network errors come in many types; all mean "no download"
            tried.append(f"download from {OFFICIAL_URL}: {error}")
    else:
        tried.append("download: skipped (TACITURN_OFFLINE is set)")
    raise DatasetNotFound(
        "Fashion-MNIST was not found. Tried:\n  - "
        + "\n  - ".join(tried)
        + "\nFix it with one of: `sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu); "
        "`taciturn data fetch fashion_mnist` on a machine with internet; or put the four IDX .gz files "
        "in a folder and pass it as data.path or $TACITURN_DATA."
    )


def load(path: Path | None = None, allow_download: bool | None = None) -> ArrayDataset:
    arrays, source = locate(path, allow_download)

    def images(name: str) -> torch.Tensor:
        x = torch.from_numpy(arrays[name]).unsqueeze(1).float()
        return x.div_(255.0).sub_(MEAN).div_(STD)

    def labels(name: str) -> torch.Tensor:
        return torch.from_numpy(arrays[name].astype(np.int64))

    return ArrayDataset(
        "fashion_mnist",
        images("train-images-idx3-ubyte.gz"),
        labels("train-labels-idx1-ubyte.gz"),
        images("t10k-images-idx3-ubyte.gz"),
        labels("t10k-labels-idx1-ubyte.gz"),
        10,
        source,
    )

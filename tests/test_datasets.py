import gzip
import shutil

import numpy as np
import pytest

from taciturn.data import fashion_mnist
from taciturn.data.datasets import DatasetNotFound, load_dataset

DEBIAN = fashion_mnist.DEBIAN_DIR
needs_debian = pytest.mark.skipif(
    not DEBIAN.is_dir(), reason="Debian's dataset-fashion-mnist is not installed"
)


@needs_debian
def test_fashion_mnist_from_debian_files():
    data = fashion_mnist.load()
    assert data.x_train.shape == (60000, 1, 28, 28) and data.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(data.y_train.numpy()).tolist() == [6000] * 10
    assert abs(float(data.x_train.mean())) < 1e-3 and abs(float(data.x_train.std()) - 1) < 1e-2


@needs_debian
def test_user_path_wins_and_env_var_works(tmp_path, monkeypatch):
    for name in fashion_mnist.FILES:
        shutil.copy(DEBIAN / name, tmp_path / name)
    _, source = fashion_mnist.locate(tmp_path, allow_download=False)
    assert source.startswith("given path")
    monkeypatch.setenv("TACITURN_DATA", str(tmp_path))
    _, source = fashion_mnist.locate(None, allow_download=False)
    assert source.startswith("$TACITURN_DATA")


@needs_debian
def test_download_verifies_checksums(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name in fashion_mnist.FILES:
        shutil.copy(DEBIAN / name, mirror / name)
    target = fashion_mnist.download(tmp_path / "cache", base_url=mirror.as_uri() + "/")
    assert sorted(p.name for p in target.iterdir()) == sorted(fashion_mnist.FILES)
    # A corrupted file on the mirror is rejected and not left in the cache.
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in fashion_mnist.FILES:
        (bad / name).write_bytes(gzip.compress(b"not fashion mnist"))
    with pytest.raises(ValueError, match="SHA-256"):
        fashion_mnist.download(tmp_path / "cache2", base_url=bad.as_uri() + "/")
    assert not any((tmp_path / "cache2").glob("*.gz"))


def test_nothing_found_lists_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", tmp_path / "no-debian")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TACITURN_DATA", raising=False)
    with pytest.raises(DatasetNotFound) as info:
        fashion_mnist.load(None)
    text = str(info.value)
    for expected in (
        "download cache",
        "Debian",
        "TACITURN_OFFLINE",
        "apt-get install",
        "taciturn data fetch",
    ):
        assert expected in text


def test_a_given_path_that_fails_is_an_error_never_a_fallback(tmp_path, monkeypatch):
    """A truncated copy at data.path: a clear error naming it (Debian's good copy is not used)."""
    for name in fashion_mnist.FILES:
        (tmp_path / name).write_bytes(gzip.compress(np.random.default_rng(0).bytes(5000))[:2500])
    with pytest.raises(DatasetNotFound, match=r"given path .*truncated or not a gzip file"):
        fashion_mnist.load(tmp_path)
    with pytest.raises(DatasetNotFound, match="given path"):
        fashion_mnist.load(tmp_path / "missing")


@needs_debian
def test_an_edited_decoded_cache_is_not_trusted(tmp_path, monkeypatch):
    """The .npy cache with its labels rewritten to 0 once trained a run on garbage (accuracy 1.0)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fashion_mnist.load(DEBIAN)
    (cached,) = (tmp_path / "taciturn" / "fashion-mnist" / "decoded").glob("*/train-labels-idx1-ubyte.gz.npy")
    np.save(cached, np.zeros(60000, np.uint8))
    data = fashion_mnist.load(DEBIAN)
    assert np.bincount(data.y_train.numpy()).tolist() == [6000] * 10


def test_digits_and_synthetic_are_seeded(rng):
    a = load_dataset("digits", np.random.default_rng(1))
    b = load_dataset("digits", np.random.default_rng(1))
    assert a.x_train.shape[1:] == (1, 8, 8) and len(a.y_train) + len(a.y_test) == 1797
    assert np.array_equal(a.y_test.numpy(), b.y_test.numpy())
    s1 = load_dataset("synthetic", np.random.default_rng(5), num_samples=100, num_features=4, num_classes=3)
    s2 = load_dataset("synthetic", np.random.default_rng(5), num_samples=100, num_features=4, num_classes=3)
    assert s1.x_train.shape == (100, 4) and np.array_equal(s1.x_train.numpy(), s2.x_train.numpy())


def test_idx_parser_rejects_wrong_magic():
    with pytest.raises(ValueError, match="not an IDX"):
        fashion_mnist._parse_idx(b"\x00\x00\x08\x01" + b"\x00" * 12, images=True)


def test_models_have_the_published_sizes():
    from taciturn.tasks.models import build_model

    def count(m):
        return sum(p.numel() for p in m.parameters())

    assert count(build_model("mlp", (1, 28, 28), 10)) == 159_010
    assert count(build_model("cnn", (1, 28, 28), 10)) == 1_663_370  # McMahan et al.'s CNN
    assert count(build_model("cnn", (1, 28, 28), 10, padding="valid")) == 582_026
    assert count(build_model("logreg", (1, 28, 28), 10)) == 7_850


@pytest.mark.parametrize(("kind", "options"), [("mlp", {"hidden": (200, 200)}), ("cnn", {}), ("logreg", {})])
def test_fast_forward_is_bit_identical_to_the_module(kind, options):
    import torch

    from taciturn.tasks.functional import sequential_forward
    from taciturn.tasks.models import build_model

    model = build_model(kind, (1, 28, 28), 10, **options)
    forward = sequential_forward(model)
    x = torch.randn(7, 1, 28, 28)
    assert torch.equal(forward(dict(model.named_parameters()), x), model(x))
    assert sequential_forward(torch.nn.Sequential(torch.nn.LayerNorm(3))) is None  # unknown layer: fall back

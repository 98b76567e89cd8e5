"""Hugging Face datasets from local files, as a taciturn dataset (the ``hf`` extra).

``data.format = "disk"`` reads a folder written by ``DatasetDict.save_to_disk``
(``datasets.load_from_disk``); json, csv and parquet files go through ``datasets.load_dataset``
with ``data_files``. A text column is tokenized once with the ``hf`` model's tokenizer (padded and
truncated to ``model.max_length``), so clients gather token ids like any other tensor. Nothing is
downloaded: ``HF_DATASETS_OFFLINE`` is set.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from taciturn.data.datasets import ArrayDataset, DataError
from taciturn.data.user import from_hf, from_tensors, held_out


def _splits(config: Any) -> tuple[Any, Any | None]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise DataError(
            "data.dataset = 'hf' needs the datasets package: pip install 'taciturn[hf]'"
        ) from None
    try:
        if config.format == "disk":
            loaded = datasets.load_from_disk(str(config.path))
        else:
            loaded = datasets.load_dataset(config.format, data_files=dict(config.data_files))
    except (FileNotFoundError, ValueError) as error:
        where = config.path if config.format == "disk" else config.data_files
        raise DataError(f"cannot read a Hugging Face dataset from {where}: {error}") from None
    if not hasattr(loaded, "keys"):  # a single Dataset
        return loaded, None
    if "train" not in loaded:
        raise DataError(f"the dataset has no 'train' split; it has {', '.join(loaded.keys())}")
    return loaded["train"], loaded.get("test")


def _tokenized(split: Any, tokenizer: Any, config: Any, max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    for column in (config.text, config.label):
        if column not in split.column_names:
            raise DataError(f"no column {column!r}; columns: {', '.join(split.column_names)}")
    encoded = tokenizer(
        list(split[config.text]),
        padding="max_length",
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    return encoded["input_ids"], torch.as_tensor(np.asarray(split[config.label]))


def load_hf_dataset(config: Any, model: Any, column: str | None, rng: np.random.Generator) -> ArrayDataset:
    """The dataset [data] names; ``column``: the natural partition's client column."""
    train, test = _splits(config)
    name = str(config.path or config.data_files["train"])
    if column is not None and column not in train.column_names:
        raise DataError(f"no column {column!r} to partition by; columns: {', '.join(train.column_names)}")
    if config.input is not None:
        if test is None:
            return held_out(
                from_hf(train, train.select(range(1)), config.input, config.label, name, column), rng
            )
        return from_hf(train, test, config.input, config.label, name, column)
    from taciturn.tasks.hf import load_tokenizer

    tokenizer = load_tokenizer(model.name_or_path)
    x, y = _tokenized(train, tokenizer, config, model.max_length)
    groups = None if column is None else np.asarray(train[column])
    if test is None:
        return held_out(from_tensors(x, y, x[:1], y[:1], name=name, groups=groups), rng)
    x_test, y_test = _tokenized(test, tokenizer, config, model.max_length)
    return from_tensors(x, y, x_test, y_test, name=name, groups=groups)

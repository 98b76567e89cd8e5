"""Hugging Face models through taciturn's tasks (the ``hf`` extra), offline.

A sequence classifier (``AutoModelForSequenceClassification``) is wrapped so that it reads a batch
of token ids like any model reads a tensor: ``forward(ids) = model(ids, attention_mask=ids != pad).logits``;
the classification task then federates it unchanged. The wrapper adds the prefix ``model.`` to
the names, which export removes (``WRAPPED``), so a state_dict loads into the Hugging Face class.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from taciturn.core.errors import TaciturnError

WRAPPED = "model."


class HfModelNotFound(TaciturnError, FileNotFoundError):
    """A Hugging Face model or tokenizer that cannot be loaded (offline, no such folder)."""


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise HfModelNotFound("Hugging Face models need transformers: pip install 'taciturn[hf]'") from None
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _load(loader, name_or_path: str, what: str):
    try:
        return loader.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        raise HfModelNotFound(
            f"cannot load the {what} {name_or_path!r} (offline: a folder written by save_pretrained, or a "
            f"hub id already in the cache): {str(error).splitlines()[0]}"
        ) from None


def load_tokenizer(name_or_path: str):
    return _load(_transformers().AutoTokenizer, name_or_path, "tokenizer")


class SequenceClassifier(nn.Module):
    """Token ids in, class scores out; padding masked."""

    def __init__(self, model: nn.Module, pad_token_id: int):
        super().__init__()
        self.model = model
        self.pad_token_id = pad_token_id

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=(ids != self.pad_token_id).long()).logits


def sequence_classifier(name_or_path: str) -> SequenceClassifier:
    transformers = _transformers()
    model = _load(transformers.AutoModelForSequenceClassification, name_or_path, "model")
    tokenizer = load_tokenizer(name_or_path)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id
    return SequenceClassifier(model, 0 if pad is None else pad)


def causal_lm(path: str):
    """A causal LM and its tokenizer from a save_pretrained folder."""
    transformers = _transformers()
    model = _load(transformers.AutoModelForCausalLM, path, "model")
    return model.eval(), load_tokenizer(path)

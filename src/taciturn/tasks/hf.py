"""Hugging Face models through taciturn's tasks (the ``hf`` extra), offline.

A Hugging Face model does not read a tensor and return one as taciturn's tasks expect: it takes
``input_ids`` and an ``attention_mask`` and returns a ``ModelOutput`` whose ``logits`` are the
scores. So it is wrapped (``TokenModel``) to read a batch of token ids like any model reads a
tensor: ``forward(ids) = model(input_ids=ids, attention_mask=ids != pad).logits``; the task then
federates it unchanged. That holds for a sequence classifier loaded from ``model.name_or_path``
(``model.kind = "hf"``, its tokenizer's padding token) and for any Hugging Face model given as an
object (``taciturn.run(model=...)``, a ``model.factory``; the padding token of its config). The
wrapper adds the prefix ``model.`` to the names, which export removes (``WRAPPED``), so a
state_dict loads into the Hugging Face class.
"""

from __future__ import annotations

import os
import sys

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


class TokenModel(nn.Module):
    """Token ids in, the Hugging Face model's logits out (class scores, or next-token scores of a
    causal LM); padding masked (no mask when the model has no padding token: every token counts)."""

    def __init__(self, model: nn.Module, pad_token_id: int | None):
        super().__init__()
        self.model = model
        self.pad_token_id = pad_token_id

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = None if self.pad_token_id is None else (ids != self.pad_token_id).long()
        outputs = self.model(input_ids=ids, attention_mask=mask)
        if getattr(outputs, "logits", None) is None:
            raise TypeError(
                f"{type(self.model).__name__} returns {type(outputs).__name__} without logits: federate a "
                "model with a head (AutoModelForSequenceClassification, AutoModelForCausalLM, ...)"
            )
        return outputs.logits


def is_hf_model(model: object) -> bool:
    """Whether ``model`` is a Hugging Face ``PreTrainedModel`` (transformers is imported if it is)."""
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def token_model(model: nn.Module) -> TokenModel:
    """A Hugging Face model given as an object, masking its config's padding token."""
    return TokenModel(model, getattr(model.config, "pad_token_id", None))


def sequence_classifier(name_or_path: str) -> TokenModel:
    transformers = _transformers()
    model = _load(transformers.AutoModelForSequenceClassification, name_or_path, "model")
    tokenizer = load_tokenizer(name_or_path)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id
    return TokenModel(model, 0 if pad is None else pad)


def causal_lm(path: str):
    """A causal LM and its tokenizer from a save_pretrained folder."""
    transformers = _transformers()
    model = _load(transformers.AutoModelForCausalLM, path, "model")
    return model.eval(), load_tokenizer(path)

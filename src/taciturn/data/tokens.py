"""Token batches for instruction tuning: the federated view of a tokenized instruction set.

Every example becomes prompt + response + end-of-sequence, cut to ``max_length`` tokens, stored
once in one padded tensor; clients own index arrays into it (like ``FederatedData``). A batch is
right-padded to its longest member, and its ``labels`` are -100 on the prompt and the padding,
so the loss is the response's next-token cross-entropy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from taciturn.data.federated import ClientSlices
from taciturn.data.instructions import Example, InstructionSet
from taciturn.data.partition import class_histogram

IGNORE = -100  # the label PyTorch's and Hugging Face's cross-entropy skip


class Tokenizer(Protocol):
    pad_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def encode_example(example: Example, tokenizer: Tokenizer, max_length: int) -> tuple[list[int], int]:
    """(prompt + response + eos token ids, prompt length), at most ``max_length`` tokens.

    A long prompt is cut from the left (its end, "### Response:", matters most) so that at least
    half of ``max_length`` is left for the response, which is then cut from the right.
    """
    prompt = tokenizer.encode(example.prompt)
    answer = [*tokenizer.encode(example.output), tokenizer.eos_id]
    room = max_length - min(len(answer), max_length // 2)
    prompt = prompt[-room:] if len(prompt) > room else prompt
    return (prompt + answer)[:max_length], len(prompt)


def collate(encoded: list[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad (tokens, prompt length) pairs into a batch whose labels skip prompt and padding."""
    width = max(len(tokens) for tokens, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.int64)
    for i, (tokens, _) in enumerate(encoded):
        ids[i, : len(tokens)] = torch.tensor(tokens)
    return _masked(ids, torch.tensor([len(t) for t, _ in encoded]), torch.tensor([p for _, p in encoded]))


def _masked(ids: torch.Tensor, lengths: torch.Tensor, prompts: torch.Tensor) -> dict[str, torch.Tensor]:
    position = torch.arange(ids.shape[1])[None, :]
    attention = position < lengths[:, None]
    labels = ids.masked_fill(~attention | (position < prompts[:, None]), IGNORE)
    return {"input_ids": ids, "attention_mask": attention.long(), "labels": labels}


@dataclass(frozen=True)
class TokenData(ClientSlices):
    dataset: InstructionSet
    ids: torch.Tensor  # int64 (n, longest example), padded with pad_id
    lengths: torch.Tensor  # int64 (n,)
    prompt_lengths: torch.Tensor  # int64 (n,)
    pad_id: int
    offsets: np.ndarray  # client i owns order[offsets[i]:offsets[i+1]]
    order: np.ndarray

    @classmethod
    def build(
        cls, dataset: InstructionSet, parts: list[np.ndarray], tokenizer: Tokenizer, max_length: int
    ) -> TokenData:
        encoded = [encode_example(e, tokenizer, max_length) for e in dataset.train]
        padded = collate(encoded, tokenizer.pad_id)
        sizes = np.array([len(p) for p in parts], dtype=np.int64)
        order = np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)
        if len(order) != len(encoded) or len(np.unique(order)) != len(order):
            raise ValueError("a partition must assign every training example to exactly one client")
        return cls(
            dataset,
            padded["input_ids"],
            torch.tensor([len(t) for t, _ in encoded]),
            torch.tensor([p for _, p in encoded]),
            tokenizer.pad_id,
            np.concatenate([[0], np.cumsum(sizes)]),
            order,
        )

    def batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        idx = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        lengths = self.lengths[idx]
        return _masked(self.ids[idx, : int(lengths.max())], lengths, self.prompt_lengths[idx])

    def histogram(self) -> np.ndarray:
        parts = [self.client_indices(c) for c in range(self.num_clients)]
        return class_histogram(self.dataset.labels, parts, self.dataset.num_classes)

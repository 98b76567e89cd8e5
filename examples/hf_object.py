"""A Hugging Face model object as model=: a BERT classifier on token ids, exported for transformers.

The model here is a tiny random BERT built from a config, to stay offline; yours may come from
from_pretrained. The inputs are token ids, as a tokenizer gives them (input_ids, int64, padded).
"""

import torch
import transformers

import taciturn

bert = transformers.BertConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
    num_labels=2,
)
torch.manual_seed(0)
model = transformers.BertForSequenceClassification(bert)  # or AutoModelFor...from_pretrained(...)

g = torch.Generator().manual_seed(0)
ids = torch.randint(1, 100, (400, 16), generator=g)  # tokenizer(texts, padding=...)["input_ids"]
ids[:, 12:] = bert.pad_token_id  # padding, which the attention mask hides
labels = (ids[:, 0] >= 50).long()
data = taciturn.data.from_tensors(ids[:300], labels[:300], ids[300:], labels[300:])
config = {
    "rounds": 4,
    "partition": {"kind": "iid", "num_clients": 10},
    "algorithm": {
        "fraction": 0.5,
        "local": {"epochs": 2, "batch_size": 16, "optimizer": "adamw", "lr": 0.003},
    },
}
result = taciturn.run(config, model=model, data=data, out="runs/bert", overwrite=True, progress=False)
print(result.metrics[-1]["accuracy"])
trained = result.model  # a BertForSequenceClassification with the federated weights
taciturn.export(result.dir, "runs/bert-model", format="hf", model=model, overwrite=True)  # save_pretrained
reloaded = transformers.AutoModelForSequenceClassification.from_pretrained("runs/bert-model")

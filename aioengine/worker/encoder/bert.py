"""A BERT encoder (``BertModel``): embeddings, post-norm transformer layers, bidirectional
attention over each input of a padded batch; with ``BertForSequenceClassification``'s head (a
cross-encoder reranker) as well. Weights come from the checkpoint's safetensors under their
Hugging Face names (with or without the ``bert.`` prefix a task head adds)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from aioengine.worker.loader.weights import safetensors_files

_ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float,
                 act: str) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, intermediate)
        self.ffn_out = nn.Linear(intermediate, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.act = _ACTIVATIONS[act]

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.attn_norm(x + self.attn_out(a.transpose(1, 2).reshape(b, s, h)))
        return self.ffn_norm(x + self.ffn_out(self.act(self.ffn_in(x))))


class ClassifierHead(nn.Module):
    """``BertForSequenceClassification``'s: the pooler (dense + tanh over the first token's
    state), then one linear to the labels' logits."""

    def __init__(self, hidden: int, num_labels: int) -> None:
        super().__init__()
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.pooler(states[:, 0])))


class BertEncoder(nn.Module):
    def __init__(self, config: dict[str, Any], *, classifier: bool = False) -> None:
        super().__init__()
        hidden, eps = config["hidden_size"], config.get("layer_norm_eps", 1e-12)
        act = config.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"BERT hidden_act {act!r} is not supported (known: "
                             f"{sorted(_ACTIVATIONS)})")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("BERT position_embedding_type "
                             f"{config['position_embedding_type']!r} is not supported "
                             "(absolute only)")
        self.hidden_size = hidden
        self.max_positions = config["max_position_embeddings"]
        self.word = nn.Embedding(config["vocab_size"], hidden)
        self.position = nn.Embedding(self.max_positions, hidden)
        self.token_type = nn.Embedding(config.get("type_vocab_size", 2), hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(
            BertLayer(hidden, config["num_attention_heads"], config["intermediate_size"], eps, act)
            for _ in range(config["num_hidden_layers"]))
        labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
        self.head = ClassifierHead(hidden, labels) if classifier else None

    def forward(self, ids: torch.Tensor, type_ids: torch.Tensor,
                valid: torch.Tensor) -> torch.Tensor:
        """``ids``, ``type_ids``: ``[batch, seq]``; ``valid``: ``[batch, seq]`` bool, False on
        padding. Returns the last layer's states ``[batch, seq, hidden]``."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.embed_norm(self.word(ids) + self.position(positions)
                            + self.token_type(type_ids))
        mask = valid[:, None, None, :]  # every query attends to its input's own tokens
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def load_safetensors(self, model_dir: str) -> None:
        """Every parameter from the checkpoint; ValueError naming what is missing or
        mis-shaped (nothing half-loaded is used: the caller drops the module)."""
        tensors: dict[str, torch.Tensor] = {}
        for path in safetensors_files(model_dir):
            with safe_open(path, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    tensors[name.removeprefix("bert.")] = f.get_tensor(name)
        own = self.state_dict()
        for name, target in own.items():
            parts = [tensors.get(n) for n in _checkpoint_names(name)]
            missing = [n for n, t in zip(_checkpoint_names(name), parts, strict=True)
                       if t is None]
            if missing:
                raise ValueError(f"{model_dir}: the checkpoint has no {missing[0]!r}")
            value = parts[0] if len(parts) == 1 else torch.cat(parts)  # type: ignore[arg-type]
            if value.shape != target.shape:
                raise ValueError(f"{model_dir}: {_checkpoint_names(name)[0]!r} has shape "
                                 f"{tuple(value.shape)}, the config gives {tuple(target.shape)}")
            target.copy_(value)


_EMBEDDINGS = {"word": "word_embeddings", "position": "position_embeddings",
               "token_type": "token_type_embeddings", "embed_norm": "LayerNorm"}
_HEAD = {"pooler": "pooler.dense", "classifier": "classifier"}
_LAYER = {"attn_out": ["attention.output.dense"], "attn_norm": ["attention.output.LayerNorm"],
          "ffn_in": ["intermediate.dense"], "ffn_out": ["output.dense"],
          "ffn_norm": ["output.LayerNorm"],
          "qkv": ["attention.self.query", "attention.self.key", "attention.self.value"]}


def _checkpoint_names(name: str) -> list[str]:
    """Our parameter name -> the Hugging Face names it is made of (q, k, v for ``qkv``)."""
    parts = name.split(".")
    if parts[0] == "layers":
        index, module, leaf = parts[1], parts[2], parts[3]
        return [f"encoder.layer.{index}.{m}.{leaf}" for m in _LAYER[module]]
    if parts[0] == "head":
        return [f"{_HEAD[parts[1]]}.{parts[2]}"]
    return [f"embeddings.{_EMBEDDINGS[parts[0]]}.{parts[1]}"]


def load_bert(model_dir: str, config: dict[str, Any], device: torch.device, *,
              classifier: bool = False) -> BertEncoder:
    with torch.device("meta"):
        model = BertEncoder(config, classifier=classifier)
    model = model.to_empty(device=device).to(torch.float32)
    with torch.no_grad():
        model.load_safetensors(model_dir)
    return model.eval()

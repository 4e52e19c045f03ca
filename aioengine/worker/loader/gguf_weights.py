"""GGUF tensors -> model parameters.

The file is memory-mapped (``gguf.GGUFReader``); each checkpoint tensor becomes a
``GGUFTensorSource`` that a parameter's ``load`` slices like a safetensors slice: only the rows
a rank asks for are read and dequantized (quantized blocks run along a row, so a row range is
a byte range). Names come from the ``gguf`` package's own HF <-> GGUF tensor-name map.

llama.cpp's converter permutes the rows of Llama's q and k projections (its RoPE pairs
adjacent dimensions, Hugging Face's pairs the two halves of a head); the source undoes that by
reading rows in the inverse order, for raw blocks too, so a layer that keeps weights quantized
(``raw_rows``) gets Hugging Face's row order as well.

Per family (as llama.cpp's converter writes them): experts are stacked in one 3-D tensor per
projection (``ffn_gate_exps``: experts x rows x cols), of which each HF expert tensor is one
slab; Gemma 3's norms are stored with the 1 of its ``(1 + w)`` already added; Phi-3's fused
qkv and gate/up tensors are stored fused, as in its HF checkpoint.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import numpy as np
import torch

from aioengine.hub.gguf_types import SUPPORTED_TYPES, unsupported_types
from aioengine.worker.loader.gguf_report import log_tensor_paths
from aioengine.worker.models import CausalLM
from aioengine.worker.parallel.weights import check_shape

logger = logging.getLogger(__name__)

# GGUF architectures whose q/k rows llama.cpp's converter permutes (as transformers undoes).
_PERMUTED_QK = ("llama", "smollm3")
# Tensors the converter stores but the config already determines (Llama 3 RoPE frequencies;
# Phi-3's longrope factors, read into the config by aioengine.hub.gguf_families).
_DERIVED = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# Architectures whose files store RMSNorm weights as 1 + w (llama.cpp's Gemma3Model.norm_shift).
_NORM_SHIFTED = ("gemma3",)
# An HF per-expert tensor: the GGUF name is that of the stacked experts (index dropped).
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+\.weight)$")
_FLOAT_TYPES = {"F32": np.float32, "F16": np.float16}


class GGUFTensorSource:
    """One GGUF tensor, sliceable like a checkpoint slice: ``src[a:b]`` (rows),
    ``src[:, a:b]`` (columns of all rows) and ``src[:]`` give float32 tensors in Hugging
    Face's layout (out_features, in_features); ``raw_rows`` gives the stored blocks."""

    def __init__(self, tensor: Any, row_order: np.ndarray | None = None,
                 expert: int | None = None, shift: float = 0.0) -> None:
        self.name: str = tensor.name
        self.qtype = tensor.tensor_type
        self._data = tensor.data  # numpy memmap: float rows, or uint8 rows of blocks
        shape = tuple(int(d) for d in reversed(tensor.shape))  # ggml's ne is reversed
        if expert is not None:  # one slab of stacked experts (experts, rows, cols)
            if len(shape) != 3 or not 0 <= expert < shape[0]:
                raise ValueError(f"GGUF tensor {self.name}: expert {expert} of shape {shape}")
            self._data, shape = self._data[expert], shape[1:]
        self._shape = shape
        self._row_order = row_order  # HF row i is file row row_order[i]
        self._shift = shift  # added to every value (Gemma 3's stored 1 + w norms: -1)
        # for the start-up log (gguf_report.py): the file tensor's bytes, what layers kept of
        # it by path, and the float32 bytes read through [] that no layer noted
        self.file_bytes = int(tensor.n_bytes)
        self.kept: dict[str, int] = {}
        self.float_bytes = 0

    def note_kept(self, path: str, nbytes: int, read: int = 0) -> None:
        """A layer kept ``nbytes`` of this tensor as ``path`` (gguf_report.py), made from
        ``read`` bytes of float32 values it read through ``[]``."""
        self.kept[path] = self.kept.get(path, 0) + nbytes
        self.float_bytes -= read

    def get_shape(self) -> tuple[int, ...]:
        return self._shape

    def raw_rows(self, start: int, length: int) -> np.ndarray:
        """Rows ``[start, start+length)`` as stored (uint8 blocks for quantized types), in
        Hugging Face's row order."""
        if self._row_order is None:
            return self._data[start:start + length]
        return self._data[self._row_order[start:start + length]]

    def __getitem__(self, key: Any) -> torch.Tensor:
        parts = key if isinstance(key, tuple) else (key,)  # src[a:b], src[(a:b,)], src[:, a:b]
        rows, cols = (*parts, slice(None))[:2] if len(parts) <= 2 else (None, None)
        if not isinstance(rows, slice) or not isinstance(cols, slice) or rows.step not in (None,
                                                                                           1):
            raise TypeError(f"GGUF tensor {self.name}: only [rows] and [:, cols] slices, got "
                            f"{key!r}")
        if len(self._shape) == 1:
            raw = self._data[rows]
        else:
            start, stop, _ = rows.indices(self._shape[0])
            raw = self.raw_rows(start, max(0, stop - start))
        values = _dequantize(raw, self.qtype)
        if len(self._shape) > 1:
            values = values[:, cols]
        out = np.ascontiguousarray(values, dtype=np.float32)
        if self._shift:
            out = out + np.float32(self._shift)
        elif not out.flags.writeable:  # still a view of the read-only map (F32 tensors)
            out = out.copy()
        self.float_bytes += out.nbytes
        return torch.from_numpy(out)


def _dequantize(raw: np.ndarray, qtype: Any) -> np.ndarray:
    if qtype.name in _FLOAT_TYPES:
        return np.asarray(raw)
    from gguf.quants import dequantize

    return dequantize(np.asarray(raw), qtype)


def qk_row_order(rows: int, heads: int) -> np.ndarray:
    """HF row -> file row for a q/k projection of ``heads`` heads that llama.cpp permuted:
    file = hf.reshape(heads, 2, d/2, -1).swapaxes(1, 2), so invert that on row indices."""
    permuted = np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)
    return np.argsort(permuted)


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def gguf_sources(reader: Any, model: CausalLM) -> dict[str, GGUFTensorSource]:
    """HF checkpoint name -> source, for every tensor the model loads. ValueError naming the
    tensor for an unmapped, unsupported or missing one."""
    import gguf

    arch_name = _field(reader, "general.architecture")
    archs = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch_name not in archs:
        raise ValueError(f"unknown GGUF architecture {arch_name!r}")
    spec = model.spec
    names = gguf.get_tensor_name_map(archs[arch_name], spec.num_layers)
    tensors = {t.name: t for t in reader.tensors}
    bad = unsupported_types(t.tensor_type.name for t in reader.tensors)
    if bad:
        raise ValueError(f"tensor type(s) {bad} are not supported; supported: "
                         f"{list(SUPPORTED_TYPES)}")
    sources: dict[str, GGUFTensorSource] = {}
    missing: list[str] = []
    for hf_name, target in model.weight_targets().items():
        expert = _EXPERT.match(hf_name)
        lookup = f"{expert[1]}.{expert[3]}" if expert else hf_name
        gguf_name = names.get_name(lookup, try_suffixes=(".weight", ".bias"))
        if gguf_name is None or gguf_name not in tensors:
            missing.append(f"{hf_name} ({gguf_name or 'no GGUF name'})")
            continue
        tensor = tensors[gguf_name]
        order = None
        if arch_name in _PERMUTED_QK and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
            heads = spec.num_heads if ".attn_q." in gguf_name else spec.num_kv_heads
            order = qk_row_order(int(tensor.shape[-1]), heads)
        shift = -1.0 if arch_name in _NORM_SHIFTED and target.is_norm else 0.0
        sources[hf_name] = GGUFTensorSource(tensor, order, int(expert[2]) if expert else None,
                                            shift)
    if missing:
        shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)"
                                          if len(missing) > 5 else "")
        raise ValueError(f"GGUF file lacks {len(missing)} tensor(s) the {spec.family} model "
                         f"needs: {shown}")
    return sources


def tensors_reader(path: str) -> Any:
    """A ``gguf.GGUFReader`` that skips over array fields instead of parsing them element by
    element: the tokenizer's vocabulary, merges and token types (~150k values in SmolLM2's
    file), each read through its own numpy slices, were most of the load's time on every
    start-up (docs/benchmarks.md), and the worker reads none of them (the tokenizer comes from
    the cache entry). Skipped fields keep their name and types; their contents read as empty.
    Tensors and scalar fields are read as before."""
    import struct

    import gguf

    array, string = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING

    class TensorsReader(gguf.GGUFReader):
        def __init__(self, path: str) -> None:
            super().__init__(path)
            self.path = path  # for messages

        def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
            if raw_type != array:
                return super()._get_field_parts(orig_offs, raw_type)
            itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            kind = gguf.GGUFValueType(int(itype[0]))
            offs = orig_offs + 12
            if kind == string:
                mv = memoryview(self.data)
                fmt = ">Q" if self.byte_order == "S" else "<Q"
                for _ in range(int(alen[0])):
                    offs += 8 + struct.unpack_from(fmt, mv, offs)[0]
            elif kind in self.gguf_scalar_to_np:
                size = np.dtype(self.gguf_scalar_to_np[kind]).itemsize
                offs += size * int(alen[0])
            else:  # arrays of arrays: the stock walk
                return super()._get_field_parts(orig_offs, raw_type)
            body = self._get(orig_offs + 12, np.uint8, offs - orig_offs - 12)
            return offs - orig_offs, [itype, alen, body], [], [array, kind]

    return TensorsReader(path)


def kernel_block_types(reader: Any) -> list[str]:
    """The block types among ``reader``'s tensors that the quantized CPU kernels compute (Q5_0
    widened to Q8_0 counts), sorted; empty for a float-only file."""
    from aioengine.worker.quant.kernel import QTYPES
    from aioengine.worker.quant.quantize import WIDENED

    names = {t.tensor_type.name.lower() for t in reader.tensors}
    return sorted(n for n in names if n in QTYPES or n in WIDENED)


def load_gguf(model: CausalLM, reader: Any, quantization: str | None = None) -> None:
    """Check every name and shape first, then load each rank's slice, dequantized (or as
    stored, for a layer that keeps blocks), and log per tensor type the path it runs
    (gguf_report.py; ``quantization``: the mode the model was quantized with, None: float).
    ``reader``: ``tensors_reader(path)``."""
    path = reader.path
    sources = gguf_sources(reader, model)
    used = {s.name for s in sources.values()}
    unexpected = [t.name for t in reader.tensors
                  if t.name not in used and t.name not in _DERIVED]
    if unexpected:  # a tensor we would ignore means a part of the model we do not implement
        raise ValueError(f"GGUF file {path} has {len(unexpected)} tensor(s) a "
                         f"{model.spec.family} model does not use: {unexpected[:5]}")
    targets = model.weight_targets()
    for name, target in targets.items():
        check_shape(name, target.full_shape, sources[name])
    for name, target in targets.items():
        target.load(sources[name])
    logger.info("loaded %d tensors from %s", len(targets), path)
    log_tensor_paths(sources, quantization, model.dtype)

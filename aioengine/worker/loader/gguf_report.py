"""The start-up log of what a GGUF file's tensors became, per tensor type in the file: how many,
their bytes in the file, the bytes this rank keeps of them, and the path each runs:

- ``packed <type>``: the file's blocks as stored, computed by the quantized CPU kernels;
- ``<type> (widened)``: blocks rewritten losslessly as a wider type (Q5_0 -> Q8_0);
- ``<type> (quantized at load)``: float values quantized to the policy's type;
- ``float32`` (or the model's dtype): dequantized values.

A quantized tensor type widened or dequantized although the user did not ask for it (the
quantization mode keeps blocks, or names another type) is a WARNING naming the cost: float
rows of a 4-bit type hold ~7x its bytes and run at a fraction of the packed speed, which the
log is there to make visible (issue 39: no type silently widened to float)."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import torch

logger = logging.getLogger("aioengine.worker.loader.gguf_weights")

_FLOAT_FILE_TYPES = ("F32", "F16", "BF16")
_MIB = 1 << 20


def _mib(n: float) -> str:
    return f"{n / _MIB:.1f} MiB" if n >= _MIB else f"{n / 1024:.1f} KiB"


def _paths(src: Any, dtype: torch.dtype) -> dict[str, int]:
    """Path -> bytes this rank keeps of one source, from what the layers noted on it
    (``GGUFTensorSource.note_kept``); float values nobody noted were copied into parameters of
    ``dtype``."""
    paths = dict(src.kept)
    if src.float_bytes > 0:
        name = str(dtype).removeprefix("torch.")
        width = torch.empty(0, dtype=dtype).element_size()
        paths[name] = paths.get(name, 0) + src.float_bytes // 4 * width
    return paths


def _asked(path: str, quantization: str | None) -> bool:
    """The user asked for this path: float weights (quantization none) or the named type."""
    if path.startswith("packed") or quantization in (None, "none"):
        return True
    return path.split(" ")[0] == quantization


def log_tensor_paths(sources: dict[str, Any], quantization: str | None,
                     dtype: torch.dtype) -> None:
    """One INFO line per tensor type of the file; a WARNING per quantized type of which a path
    the user did not ask for widened tensors, with their bytes in the file and kept."""
    types: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"seen": set(), "file": 0, "paths": defaultdict(int), "wide_seen": set(),
                 "wide_file": 0, "wide": defaultdict(int)})
    for src in sources.values():
        t = types[src.qtype.name]
        paths = _paths(src, dtype)
        first = src.name not in t["seen"]  # experts: one file tensor, several sources
        t["seen"].add(src.name)
        t["file"] += src.file_bytes if first else 0
        for path, n in paths.items():
            t["paths"][path] += n
        wide = {p: n for p, n in paths.items() if not _asked(p, quantization)}
        if wide and src.qtype.name not in _FLOAT_FILE_TYPES:
            t["wide_file"] += src.file_bytes if src.name not in t["wide_seen"] else 0
            t["wide_seen"].add(src.name)
            for path, n in wide.items():
                t["wide"][path] += n
    for qname, t in sorted(types.items()):
        logger.info("GGUF %s: %d tensor(s), %s in the file, %s kept on this rank: %s", qname,
                    len(t["seen"]), _mib(t["file"]), _mib(sum(t["paths"].values())),
                    _listing(t["paths"]) or "nothing")
        if t["wide"]:
            logger.warning("GGUF %s: %d tensor(s) widened without being asked "
                           "(quantization=%r): %s in the file became %s kept (%s); the "
                           "packed kernels would keep the file's bytes", qname,
                           len(t["wide_seen"]), quantization, _mib(t["wide_file"]),
                           _mib(sum(t["wide"].values())), _listing(t["wide"]))


def _listing(paths: dict[str, int]) -> str:
    return ", ".join(f"{p} {_mib(n)}" for p, n in sorted(paths.items()))

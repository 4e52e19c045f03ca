"""A GGUF file as a model the engine resolves: its config and tokenizer written once into the
model cache (``<cache>/models/gguf-<stem>-<key>``) next to a pointer at the file itself.

The host stays torch-free: the side files are written by a child interpreter
(``python -m aioengine.hub.gguf_convert``, transformers' GGUF readers import torch), once per
file; later starts read the cache. The cache key is the file's real path, size and mtime, so an
edited or replaced file gets a fresh entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from aioengine.hub.cache import ensure_dir

GGUF_SUFFIX = ".gguf"
POINTER_FILE = "gguf_file.json"  # {"path": the GGUF file} inside the cache entry
CONVERT_VERSION = 2  # 2: per-family configs (gguf_families)
CONVERT_TIMEOUT = 300.0


def find_gguf(path: str) -> str | None:
    """The GGUF file ``path`` names: the file itself, or the one ``*.gguf`` in a directory
    without a config.json. None when ``path`` is neither; ValueError for a directory holding
    several (naming them: the caller must pick one)."""
    if os.path.isfile(path):
        return path if path.lower().endswith(GGUF_SUFFIX) else None
    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json")):
        return None
    found = sorted(n for n in os.listdir(path) if n.lower().endswith(GGUF_SUFFIX))
    if len(found) > 1:
        raise ValueError(f"model directory {path!r} holds {len(found)} GGUF files {found}: "
                         "pass the path of one of them")
    return os.path.join(path, found[0]) if found else None


def cache_name(gguf_path: str) -> str:
    real = os.path.realpath(gguf_path)
    stat = os.stat(real)
    key = hashlib.sha256(f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    stem = os.path.basename(real)[: -len(GGUF_SUFFIX)]
    return f"gguf-{stem}-{key[:12]}-v{CONVERT_VERSION}"


def gguf_model_dir(gguf_path: str) -> str:
    """The cache directory with config.json, tokenizer.json, ... for this GGUF file (written on
    first use). ValueError with the converter's reason when the file cannot be served."""
    real = os.path.realpath(gguf_path)

    def build(out_dir: str) -> None:
        cmd = [sys.executable, "-m", "aioengine.hub.gguf_convert", real, out_dir]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CONVERT_TIMEOUT,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
            reason = lines[-1] if lines else f"exit code {done.returncode}"
            raise ValueError(f"cannot read GGUF file {real!r}: {reason}")
        with open(os.path.join(out_dir, POINTER_FILE), "w", encoding="utf-8") as f:
            json.dump({"path": real}, f)

    return ensure_dir(cache_name(real), build)


def gguf_file_of(model_dir: str) -> str | None:
    """The GGUF file a cache entry points at; None for an ordinary model directory."""
    pointer = os.path.join(model_dir, POINTER_FILE)
    if not os.path.isfile(pointer):
        return None
    with open(pointer, encoding="utf-8") as f:
        path = json.load(f)["path"]
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} (recorded in {pointer}) no longer exists")
    return path

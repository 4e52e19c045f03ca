"""Runs in spawned processes: resolve the tiny model at the same moment as the others."""

from __future__ import annotations

import json
import sys


def resolve_tiny(barrier, out_file: str) -> None:
    from aioengine.hub import read_model_info, resolve_model

    barrier.wait(timeout=120)
    resolved = resolve_model("tiny", require_tokenizer=True)
    info = read_model_info(resolved.model_path)
    with open(out_file, "w") as f:
        json.dump({"path": resolved.model_path, "vocab": info.vocab_size,
                   "torch_imported": "torch" in sys.modules}, f)

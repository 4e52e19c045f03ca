"""The start-up log of the real SmolLM2 Q4_1 file (loader/gguf_report.py): its block types run
packed with quantization 'auto' (no warning), and 'none' lists the float32 bytes it asked for."""

from __future__ import annotations

import logging
import shutil

import pytest

from aioengine.hub import ResolvedModel
from aioengine.worker.loader import load_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
LOGGER = "aioengine.worker.loader.gguf_weights"


def test_the_real_file_logs_each_type_and_its_path(smollm2: ResolvedModel, caplog) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        load_model(smollm2, device="cpu", dtype="float32", quantization="auto")
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    q41 = [m for m in lines if m.startswith("GGUF Q4_1: ")]
    assert len(q41) == 1 and q41[0].endswith("packed q4_1 63.3 MiB"), lines
    assert any(m.startswith("GGUF F32: ") for m in lines)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == LOGGER]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        load_model(smollm2, device="cpu", dtype="float32", quantization="none")
    q41 = [r.getMessage() for r in caplog.records if r.getMessage().startswith("GGUF Q4_1: ")]
    assert q41 and q41[0].endswith("kept on this rank: float32 405.0 MiB")  # asked: no warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == LOGGER]

"""The start-up log of a GGUF file's tensors (loader/gguf_report.py): one INFO line per tensor
type with its count, bytes in the file, bytes kept and path; a WARNING for a quantized type
widened to float (or another type) the user did not ask for, naming the bytes."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
import torch

from aioengine.worker.loader.gguf_report import log_tensor_paths
from aioengine.worker.parallel import QKVParallelLinear, RowParallelLinear, TPInfo
from aioengine.worker.quant import QTYPES
from aioengine.worker.quant.weight import QuantPolicy

gguf = pytest.importorskip("gguf")
from tests.worker.quant.test_layers import write_gguf  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

HIDDEN, D = 512, 64
LOGGER = "aioengine.worker.loader.gguf_weights"


def _load(tmp_path, mode: str | None) -> dict:
    """q/k/v (Q3_K, Q2_K, Q5_0) into a QKV projection quantized with ``mode``, o (Q4_K) into a
    projection that is never quantized (float32 rows: a widening), a float norm."""
    rng = np.random.default_rng(0)
    srcs = write_gguf(tmp_path / f"{mode}.gguf", {
        "q": ("q3_k", rng.standard_normal((4 * D, HIDDEN)).astype(np.float32)),
        "k": ("q2_k", rng.standard_normal((2 * D, HIDDEN)).astype(np.float32)),
        "v": ("q5_0", rng.standard_normal((2 * D, HIDDEN)).astype(np.float32)),
        "o": ("q4_k", rng.standard_normal((HIDDEN, 4 * D)).astype(np.float32)),
        "norm": ("f32", rng.standard_normal((1, HIDDEN)).astype(np.float32)),
    })
    qkv = QKVParallelLinear(HIDDEN, D, 4, 2, False, TPInfo(0, 1), torch.float32, "cpu")
    if mode is not None:
        qkv.quantize(QuantPolicy(mode))
    for part, name in enumerate("qkv"):
        qkv.load(srcs[name], part)
    RowParallelLinear(4 * D, HIDDEN, False, TPInfo(0, 1), torch.float32, "cpu").load(srcs["o"])
    srcs["norm"][:]  # a norm's parameter copy
    return srcs


def _lines(caplog, level: int) -> dict[str, str]:
    return {r.getMessage().split(":")[0].removeprefix("GGUF "): r.getMessage()
            for r in caplog.records if r.name == LOGGER and r.levelno == level}


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def test_each_type_logs_its_path_and_bytes_and_unasked_float_warns(tmp_path, caplog):
    srcs = _load(tmp_path, "gguf")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        log_tensor_paths(srcs, "gguf", torch.float32)
    info = _lines(caplog, logging.INFO)
    assert set(info) == {"Q3_K", "Q2_K", "Q5_0", "Q4_K", "F32"}
    for qname, name, rows in (("Q3_K", "q", 4 * D), ("Q2_K", "k", 2 * D), ("Q5_0", "v", 2 * D)):
        blocks = rows * QTYPES[qname.lower()].row_bytes(HIDDEN)
        assert srcs[name].file_bytes == blocks
        assert info[qname] == (f"GGUF {qname}: 1 tensor(s), {_kib(blocks)} in the file, "
                               f"{_kib(blocks)} kept on this rank: packed {qname.lower()} "
                               f"{_kib(blocks)}")
    o_file, o_float = HIDDEN * QTYPES["q4_k"].row_bytes(4 * D), HIDDEN * 4 * D * 4
    assert info["Q4_K"].endswith(f"{_kib(o_file)} in the file, {_kib(o_float)} kept on this "
                                 f"rank: float32 {_kib(o_float)}")
    assert info["F32"].endswith(f"kept on this rank: float32 {_kib(HIDDEN * 4)}")
    warn = _lines(caplog, logging.WARNING)
    assert list(warn) == ["Q4_K"]  # the float file type and the packed ones do not warn
    assert warn["Q4_K"] == (f"GGUF Q4_K: 1 tensor(s) widened without being asked "
                            f"(quantization='gguf'): {_kib(o_file)} in the file became "
                            f"{_kib(o_float)} kept (float32 {_kib(o_float)}); the packed "
                            f"kernels would keep the file's bytes")


def test_asked_for_widenings_are_info_only(tmp_path, caplog):
    """quantization='q8_0' widens Q5_0 losslessly and requantizes the K-quants, as asked; with
    float weights (None) every tensor is float32, as asked: neither warns about those."""
    srcs = _load(tmp_path, "q8_0")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        log_tensor_paths(srcs, "q8_0", torch.float32)
    info = _lines(caplog, logging.INFO)
    assert info["Q5_0"].endswith(f"q8_0 (widened) {_kib(2 * D * 16 * 34)}")
    assert info["Q3_K"].endswith(f"q8_0 (quantized at load) {_kib(4 * D * 16 * 34)}")
    assert list(_lines(caplog, logging.WARNING)) == ["Q4_K"]  # the never-quantized o
    caplog.clear()
    srcs = _load(tmp_path, None)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        log_tensor_paths(srcs, None, torch.float32)
    assert _lines(caplog, logging.WARNING) == {}
    assert _lines(caplog, logging.INFO)["Q2_K"].endswith(f"float32 {_kib(2 * D * HIDDEN * 4)}")

"""A tied embedding whose table is the GGUF file's own quantized blocks: lookups dequantize the
rows they need from the head's blocks (no float copy of the table), with the values a float
copy would hold; TP shards and padding rows; a float or in-situ source keeps its float table."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from aioengine.worker.parallel import TPInfo, VocabParallelEmbedding
from aioengine.worker.quant.weight import QuantPolicy

gguf = pytest.importorskip("gguf")
from tests.worker.quant.test_layers import write_gguf  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


def _table(vocab: int, k: int, name: str, tmp_path) -> tuple:
    values = np.random.default_rng(3).standard_normal((vocab, k)).astype(np.float32)
    src = write_gguf(tmp_path / f"{name}.gguf", {"embd": (name, values)})["embd"]
    return src, src[:].float()


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0", "q5_1", "q2_k", "q3_k", "q5_k", "q6_k"])
@pytest.mark.parametrize("tp_size", [1, 3])
def test_lookups_from_quantized_blocks_equal_the_float_copy(tmp_path, qtype, tp_size):
    vocab, k = 50, 256
    src, want = _table(vocab, k, qtype, tmp_path)
    ids = torch.tensor([[0, 49, 7], [7, 16, 33]])
    for rank in range(tp_size):
        emb = VocabParallelEmbedding(vocab, k, TPInfo(rank, tp_size), torch.float32, "cpu")
        emb.quantize_head(QuantPolicy("gguf"), keep_float=True)
        emb.load(src)
        assert emb.weight is None  # no float table
        lo, hi = emb.start, emb.end
        local = torch.where((ids >= lo) & (ids < hi), ids - lo, 0)
        got = emb._lookup(local)
        assert got.shape == (2, 3, k)
        torch.testing.assert_close(got, want[lo:hi][local], atol=0, rtol=0)
        # Once the head has run it holds its blocks in the x8 layout (every type here has one
        # with int16 activations): lookups read the same values from there.
        emb.qhead.prepare()
        assert emb.qhead.segments[0].x8
        torch.testing.assert_close(emb._lookup(local), want[lo:hi][local], atol=0, rtol=0)
        if hi - lo < emb.per_rank:  # the last shard's padding rows read as zeros
            pad = torch.tensor([emb.per_rank - 1])
            assert torch.equal(emb._lookup(pad), torch.zeros(1, k))
    if tp_size == 1:
        torch.testing.assert_close(emb(ids), want[ids], atol=0, rtol=0)


def test_float_sources_keep_their_float_table(tmp_path):
    vocab, k = 40, 64
    src, want = _table(vocab, k, "f32", tmp_path)
    emb = VocabParallelEmbedding(vocab, k, TPInfo(0, 1), torch.float32, "cpu")
    emb.quantize_head(QuantPolicy("q8_0"), keep_float=True)  # quantized in situ for the head
    emb.load(src)
    assert emb.weight is not None  # lookups keep the exact float values
    torch.testing.assert_close(emb(torch.tensor([3, 39])), want[[3, 39]], atol=0, rtol=0)


def test_float_gguf_table_is_shared_with_the_head(tmp_path):
    """An F32 file kept as stored ("gguf"): the head's rows are float, and the tied table is
    that same storage (no second float copy), with the exact values for lookups and logits."""
    vocab, k = 40, 64
    src, want = _table(vocab, k, "f32", tmp_path)
    emb = VocabParallelEmbedding(vocab, k, TPInfo(0, 1), torch.float32, "cpu")
    emb.quantize_head(QuantPolicy("gguf"), keep_float=True)
    emb.load(src)
    (seg,) = emb.qhead.segments
    assert seg.qtype is None and emb.weight.data_ptr() == seg.data.data_ptr()
    torch.testing.assert_close(emb(torch.tensor([3, 39])), want[[3, 39]], atol=0, rtol=0)
    x = torch.randn(2, k)
    torch.testing.assert_close(emb.qhead(x), x @ want.t(), atol=1e-5, rtol=1e-5)


def test_float_table_padding_rows_are_zero(tmp_path):
    """Only the padding rows are zeroed at build (the load writes the rest): they look up zeros
    even where the allocator hands back dirty memory."""
    vocab, k = 50, 64
    src, want = _table(vocab, k, "f32", tmp_path)
    for rank in range(3):
        dirty = torch.full((17, k), float("nan"))  # the size of one shard's table
        del dirty
        emb = VocabParallelEmbedding(vocab, k, TPInfo(rank, 3), torch.float32, "cpu")
        emb.load(src)
        n = emb.end - emb.start
        torch.testing.assert_close(emb.weight[:n], want[emb.start:emb.end], atol=0, rtol=0)
        assert torch.equal(emb.weight[n:], torch.zeros(emb.per_rank - n, k))

"""The compiled CPU layer ops (aioengine/worker/ops) against the torch ops they replace, on odd
shapes and strided rows, their errors, and the model's CPU fast path against its module path
(same random weights, mixed prefill/decode steps, the decode kernel on and off, 1 and 2
threads)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aioengine.worker import gemv
from aioengine.worker.attention.cpu_kernel import load_decode_kernel
from aioengine.worker.attention.paged import write_kv
from aioengine.worker.models.rope import apply_rope
from aioengine.worker.ops import CpuOpsError, load_cpu_ops
from tests.worker.cpu_load import load_model
from tests.worker.driver import Driver
from tests.worker.hf_models import make_hf_model


@pytest.fixture(scope="module")
def ops():
    return load_cpu_ops()


def _rows(m: int, n: int, pad: int, gen: torch.Generator) -> torch.Tensor:
    """[m, n] with a leading dimension of n + pad (strided rows when pad > 0)."""
    return torch.randn(m, n + pad, generator=gen)[:, :n]


@pytest.mark.parametrize("m,n,pad", [(1, 1, 0), (1, 576, 0), (3, 7, 5), (17, 1000, 3),
                                     (64, 33, 0)])
@pytest.mark.parametrize("offset", [False, True])
def test_rms_norm_matches_torch(ops, m, n, pad, offset):
    gen = torch.Generator().manual_seed(m * 1000 + n)
    x, w = _rows(m, n, pad, gen) * 3, torch.randn(n, generator=gen)
    residual = _rows(m, n, pad, gen)
    want_res = x + residual
    scale = 1.0 + w if offset else w
    want = F.rms_norm(want_res, (n,), None, 1e-6) * scale
    out = ops.rms_norm(x, w, 1e-6, residual=residual, offset=offset)
    torch.testing.assert_close(residual, want_res, atol=0, rtol=0)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    # Without a residual: the norm of x alone, written into a given (strided) out.
    dst = _rows(m, n, pad, gen)
    ops.rms_norm(x, w, 1e-6, offset=offset, out=dst)
    torch.testing.assert_close(dst, F.rms_norm(x, (n,), None, 1e-6) * scale, atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("t,hq,hkv,d,rot", [(1, 9, 3, 64, 64), (5, 4, 2, 6, 6),
                                            (3, 2, 2, 10, 4), (33, 8, 1, 16, 16)])
@pytest.mark.parametrize("with_cache", [False, True, "float16"])
def test_rope_store_matches_apply_rope_and_write_kv(ops, t, hq, hkv, d, rot, with_cache):
    """A float16 cache gets exactly what ``write_kv`` stores (torch's round to nearest even)."""
    gen = torch.Generator().manual_seed(t * 100 + d)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen)
    angles = torch.rand(t, rot // 2, generator=gen) * 50
    cos, sin = angles.cos(), angles.sin()
    want = apply_rope(qkv[:, :(hq + hkv) * d].view(t, hq + hkv, d), cos.unsqueeze(1),
                      sin.unsqueeze(1))
    bs, blocks = 4, 3 * t
    cache = torch.zeros(2, hkv, blocks, bs, d,
                        dtype=torch.float16 if with_cache == "float16" else torch.float32)
    want_cache = torch.zeros_like(cache)
    slots = torch.randperm(blocks * bs, generator=gen)[:t]
    got = qkv.clone()
    if with_cache:
        ops.rope_store(got, hq, hkv, d, cos, sin, cache, slots)
        write_kv(want_cache, want[:, hq:], qkv[:, (hq + hkv) * d:].view(t, hkv, d), slots)
    else:
        ops.rope_store(got, hq, hkv, d, cos, sin)
    # Same products and sums as torch's element-wise ops (no FMA contraction): exact.
    torch.testing.assert_close(got[:, :(hq + hkv) * d].view(t, hq + hkv, d), want, atol=0,
                               rtol=0)
    torch.testing.assert_close(got[:, (hq + hkv) * d:], qkv[:, (hq + hkv) * d:], atol=0, rtol=0)
    torch.testing.assert_close(cache, want_cache, atol=0, rtol=0)


@pytest.mark.parametrize("m,n,pad", [(1, 1536, 0), (2, 7, 3), (9, 100, 0), (3, 600, 1)])
def test_silu_mul_matches_torch(ops, m, n, pad):
    gen = torch.Generator().manual_seed(n)
    x = _rows(m, 2 * n, pad, gen) * 6
    x[0, :4] = torch.tensor([0.0, 100.0, -100.0, -90.0])  # exp clamps at both ends
    want = F.silu(x[:, :n]) * x[:, n:]
    got = ops.silu_mul(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=2e-6)
    # into x's own gate columns (600: chunks of 256 values and a remainder): the same bits
    ops.silu_mul(x, out=x[:, :n])
    assert torch.equal(x[:, :n], got)


def test_errors_name_the_problem(ops):
    x = torch.randn(2, 8)
    with pytest.raises(CpuOpsError, match="CPU float32"):
        ops.rms_norm(x.double(), torch.ones(8), 1e-6)
    with pytest.raises(CpuOpsError, match="weight must be a contiguous float32 \\[8\\]"):
        ops.rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(CpuOpsError, match="residual must have x's shape"):
        ops.rms_norm(x, torch.ones(8), 1e-6, residual=torch.randn(3, 8))
    with pytest.raises(CpuOpsError, match="contiguous rows"):
        ops.rms_norm(x.t(), torch.ones(2), 1e-6)
    with pytest.raises(CpuOpsError, match="x must be \\[M, 2 \\* I\\]"):
        ops.silu_mul(torch.randn(2, 7))
    qkv = torch.randn(3, 4 * 8)
    cs = torch.ones(3, 4)
    with pytest.raises(CpuOpsError, match="qkv must be \\[M, 40\\] with contiguous rows"):
        ops.rope_store(qkv, 3, 1, 8, cs, cs)
    qkv = torch.randn(3, 4 * 8)
    with pytest.raises(CpuOpsError, match="cos must be a contiguous float32 \\[3, R/2\\]"):
        ops.rope_store(qkv, 2, 1, 8, torch.ones(2, 4), cs)
    with pytest.raises(CpuOpsError, match="rotary dims 10 exceed head_dim 8"):
        ops.rope_store(qkv, 2, 1, 8, torch.ones(3, 5), torch.ones(3, 5))
    cache = torch.zeros(2, 1, 2, 4, 8)
    with pytest.raises(CpuOpsError, match="slots must be a contiguous int64"):
        ops.rope_store(qkv, 2, 1, 8, cs, cs, cache, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(CpuOpsError, match="a KV slot is outside the cache"):
        ops.rope_store(qkv, 2, 1, 8, cs, cs, cache, torch.tensor([0, 8, 1]))
    with pytest.raises(CpuOpsError, match="a KV slot is outside the cache"):
        ops.rope_store(qkv, 2, 1, 8, cs, cs, cache, torch.tensor([0, -1, 1]))
    assert torch.equal(cache, torch.zeros_like(cache))  # nothing written on a rejected call


def _schedule(model, cfg, kernel, kv_dtype=None) -> Driver:
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
               for n in (11, 3, 25)]
    d = Driver(model, cfg, block_size=4, decode_kernel=kernel, kv_dtype=kv_dtype)
    for p in prompts[:2]:
        d.add(p)
    d.step([(0, 11), (1, 3)])
    d.decode_all(3)
    d.add(prompts[2])
    d.step([(2, 9), (0, 1), (1, 1)])  # a prefill chunk with decodes: mixed step
    d.step([(2, 16)])  # a chunk over a cached prefix
    d.decode_all(5)
    return d


@pytest.mark.parametrize("variant", ["llama3-tied", "phi3", "mistral"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("use_kernel", "kv_dtype"), [(False, None), (True, None),
                                                     (True, torch.float16)])
def test_fast_path_matches_module_path(tmp_path, variant, threads, use_kernel, kv_dtype):
    make_hf_model(variant, str(tmp_path), seed=11)
    model, cfg = load_model(str(tmp_path), dtype="float32", device="cpu")
    assert model.cpu_path is not None
    kernel = load_decode_kernel() if use_kernel else None
    old_torch, old_gemv = torch.get_num_threads(), gemv.threads()
    torch.set_num_threads(threads)
    gemv.set_threads(threads)
    try:
        fast = _schedule(model, cfg, kernel, kv_dtype)
        path, model.cpu_path = model.cpu_path, None
        slow = _schedule(model, cfg, kernel, kv_dtype)
        model.cpu_path = path
    finally:
        torch.set_num_threads(old_torch)
        gemv.set_threads(old_gemv)
    # A float16 cache rounds k/v: a last-bit difference between the paths' norms can move a
    # value to the next float16 (2**-11 relative), so the logits get a wider tolerance.
    atol, rtol = (2e-4, 1e-3) if kv_dtype == torch.float16 else (2e-5, 1e-5)
    for a, b in zip(fast.seqs, slow.seqs, strict=True):
        assert a.tokens == b.tokens
        for p, logits in a.logits.items():
            torch.testing.assert_close(logits, b.logits[p], atol=atol, rtol=rtol)

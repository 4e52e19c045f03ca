"""The compiled CPU decode kernel (real compiler, real shared object) against a float64
reference over gathered K/V, through ``paged_attention`` against the SDPA path, and the errors
its inputs get; over a float32 and a float16 cache (the float16 one is read exactly: the same
tolerances against a reference over its float16 values)."""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from aioengine.worker.attention import build_attention_metadata, paged_attention
from aioengine.worker.attention.cpu_kernel import (
    DecodeKernelError,
    PagedDecodeKernel,
    load_decode_kernel,
)

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


@pytest.fixture(scope="module")
def kernel() -> PagedDecodeKernel:
    return load_decode_kernel()


def reference(q: torch.Tensor, cache: torch.Tensor, tables: list[list[int]],
              ctx: list[int]) -> torch.Tensor:
    """softmax(q K^T * scale) V in float64 over each sequence's gathered keys and values."""
    _, hkv, _, bs, d = cache.shape
    out = torch.empty(len(ctx), q.shape[1], d, dtype=torch.float64)
    for b, (table, n) in enumerate(zip(tables, ctx, strict=True)):
        blocks = torch.tensor(table[:-(-n // bs)])
        kv = cache[:, :, blocks].reshape(2, hkv, -1, d)[:, :, :n].double()
        group = q.shape[1] // hkv
        k, v = kv[0].repeat_interleave(group, 0), kv[1].repeat_interleave(group, 0)
        scores = torch.einsum("hd,hnd->hn", q[b].double(), k) * d ** -0.5
        out[b] = torch.einsum("hn,hnd->hd", scores.softmax(-1), v)
    return out


def random_tables(rng: random.Random, ctx: list[int], bs: int, num_blocks: int,
                  shared: int) -> list[list[int]]:
    """Blocks in random order (no runs), the first ``shared`` blocks common to every sequence
    (a cached prefix), padded with block 0 to one width."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    prefix = [free.pop() for _ in range(shared)]
    tables = []
    for n in ctx:
        need = -(-n // bs)
        own = [free.pop() for _ in range(max(0, need - shared))]
        tables.append((prefix + own)[:need])
    width = max(len(t) for t in tables) + 1
    return [t + [0] * (width - len(t)) for t in tables]


@pytest.mark.parametrize(("hq", "hkv", "d", "bs"), [
    (4, 4, 32, 16), (8, 4, 32, 16), (8, 2, 32, 16),  # GQA groups 1, 2, 4
    (8, 4, 64, 16), (16, 4, 128, 16),  # the other specialised head dims
    (6, 3, 40, 5),  # a head dim without its own copy, a block size that is no power of two
])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_kernel_matches_float64_reference(kernel, hq, hkv, d, bs, seed, cache_dtype):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 160
    cache = torch.randn(2, hkv, num_blocks, bs, d, generator=gen).to(cache_dtype)
    # Context lengths 1 .. several blocks, exact block ends included.
    ctx = [1, 2, bs - 1, bs, bs + 1, 3 * bs, *(rng.randint(1, 9 * bs) for _ in range(6))]
    shared = 2 if seed else 0
    ctx = [max(n, shared * bs + 1) if shared else n for n in ctx]
    tables = random_tables(rng, ctx, bs, num_blocks, shared)
    q = torch.randn(len(ctx), hq, d, generator=gen)
    out = torch.full_like(q, float("nan"))
    kernel(q, cache, torch.tensor(tables), torch.tensor(ctx), d ** -0.5, out)
    torch.testing.assert_close(out.double(), reference(q, cache, tables, ctx), atol=2e-6,
                               rtol=1e-5)


def test_kernel_is_stable_for_large_scores(kernel):
    """Scores in the thousands (and one far above the rest): no overflow, no NaN."""
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, bs = 4, 2, 32, 16
    cache = torch.randn(2, hkv, 8, bs, d, generator=gen) * 30
    tables, ctx = [[3, 1, 6, 0]], [50]
    q = torch.randn(1, hq, d, generator=gen) * 30
    out = torch.empty_like(q)
    kernel(q, cache, torch.tensor(tables), torch.tensor(ctx), d ** -0.5, out)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), reference(q, cache, tables, ctx), atol=1e-4,
                               rtol=1e-5)


def test_kernel_reads_strided_query_rows_and_writes_chosen_rows(kernel):
    """q as the model hands it over (a slice of the fused q|k projection: rows strided), and
    sequence b at row rows[b]: other rows of out are left alone."""
    gen = torch.Generator().manual_seed(5)
    hq, hkv, d, bs = 8, 4, 32, 4
    cache = torch.randn(2, hkv, 30, bs, d, generator=gen)
    qk = torch.randn(5, hq + hkv, d, generator=gen)
    q = qk[:, :hq]
    assert not q.is_contiguous()
    tables, ctx, rows = [[7, 2, 9], [4, 0, 0]], [11, 3], [3, 1]
    out = torch.zeros(5, hq, d)
    kernel(q, cache, torch.tensor(tables), torch.tensor(ctx), d ** -0.5, out,
           torch.tensor(rows))
    ref = reference(q[rows], cache, tables, ctx)
    torch.testing.assert_close(out[rows].double(), ref, atol=2e-6, rtol=1e-5)
    assert out[[0, 2, 4]].eq(0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_paged_attention_with_kernel_matches_sdpa_path(kernel, seed, cache_dtype):
    """Whole steps (prefills beside decodes, decodes alone, shared prefix blocks) through
    ``paged_attention``: the kernel path against today's spans/buckets path (over a float16
    cache both write rounded k/v and widen what they read)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    hq, hkv, d, bs, n = 8, 2, 32, 4, 7
    cache_a = torch.zeros(2, hkv, 120, bs, d, dtype=cache_dtype)
    free = list(range(8, 120))
    rng.shuffle(free)
    prefix = list(range(8))  # sequences 0-2 share two blocks (a cached prefix of 8 tokens)
    tables = [prefix[:2] + [free.pop() for _ in range(12)] if i < 3 else
              list(range(8 + 14 * i, 8 + 14 * i + 14)) if i % 2 else
              [free.pop() for _ in range(14)] for i in range(n)]
    lengths = [rng.randint(10, 50) for _ in range(n)]
    done = [8 if i < 3 else 0 for i in range(n)]  # their prefix is in the cache
    prefill = torch.randn(8, hkv, d, generator=gen)
    for c in (0, 1):  # the prefix's k and v, as its first prefill wrote them
        cache_a[c, :, :2] = prefill.transpose(0, 1).reshape(hkv, 2, bs, d) * (c + 1)
    cache_b = cache_a.clone()
    steps = 0
    while any(done[i] < lengths[i] for i in range(n)):
        plan = [(i, 1 if done[i] else rng.randint(1, lengths[i])) for i in range(n)
                if done[i] < lengths[i] and rng.random() < 0.8]
        if not plan:
            continue
        if steps % 3 == 0:  # every third step: decodes alone
            plan = [(i, m) for i, m in plan if m == 1] or plan
        chunks = [(done[i], m, tables[i]) for i, m in plan]
        total = sum(m for _, m in plan)
        q = torch.randn(total, hq, d, generator=gen)
        k = torch.randn(total, hkv, d, generator=gen)
        v = torch.randn(total, hkv, d, generator=gen)
        with_kernel = build_attention_metadata(chunks, bs, decode_kernel=kernel)
        plain = build_attention_metadata(chunks, bs, span_min_keys=8)
        if with_kernel.decode is not None:
            assert with_kernel.decode.spans == [] and with_kernel.decode.buckets == []
        got = paged_attention(q, k, v, cache_a, with_kernel, d ** -0.5)
        want = paged_attention(q, k, v, cache_b, plain, d ** -0.5)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
        for i, m in plan:
            done[i] += m
        steps += 1
    assert torch.equal(cache_a, cache_b)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_sliding_window_reads_only_the_window(kernel, cache_dtype):
    """Window starts: the kernel equals the float64 reference over the last W keys, and never
    reads the blocks wholly before the window (their ids here point outside the cache)."""
    hq, hkv, d, bs, num_blocks = 4, 2, 32, 4, 16
    gen = torch.Generator().manual_seed(4)
    cache = torch.randn(2, hkv, num_blocks, bs, d, generator=gen).to(cache_dtype)
    ctx, window = [13, 6, 9], 5
    tables = [[99, 98, 2, 3], [4, 5], [7, 8, 9]]  # 99, 98: freed, before the window
    q = torch.randn(3, hq, d, generator=gen)
    starts = torch.tensor([max(0, n - window) for n in ctx])
    table_t = torch.tensor([t + [0] * (4 - len(t)) for t in tables])
    got = kernel(q, cache, table_t, torch.tensor(ctx), d ** -0.5, torch.empty_like(q), None,
                 starts)
    for b, n in enumerate(ctx):
        first = int(starts[b])
        blocks = torch.tensor(tables[b][first // bs:-(-n // bs)])
        kv = cache[:, :, blocks].reshape(2, hkv, -1, d)[:, :, first % bs:first % bs + n - first]
        k, v = (x.double().repeat_interleave(hq // hkv, 0) for x in kv)
        scores = torch.einsum("hd,hnd->hn", q[b].double(), k) * d ** -0.5
        want = torch.einsum("hn,hnd->hd", scores.softmax(-1), v)
        torch.testing.assert_close(got[b].double(), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(DecodeKernelError, match="a window start is < 0 or not before"):
        kernel(q, cache, table_t, torch.tensor(ctx), 1.0, torch.empty_like(q), None,
               torch.tensor([8, 6, 4]))
    with pytest.raises(DecodeKernelError, match="a block id is outside the KV cache"):
        kernel(q, cache, table_t, torch.tensor(ctx), 1.0, torch.empty_like(q), None,
               torch.tensor([7, 0, 0]))  # block 1 (id 98) is inside this window


def test_metadata_for_the_kernel(kernel):
    meta = build_attention_metadata([(7, 1, [1, 2]), (2, 1, [3])], 4, decode_kernel=kernel)
    dec = meta.decode
    assert dec.kernel is kernel and dec.token_index is None
    assert dec.block_tables.tolist() == [[1, 2], [3, 0]] and dec.context_lens.tolist() == [8, 3]
    mixed = build_attention_metadata([(0, 3, [5]), (7, 1, [1, 2]), (0, 2, [6]), (2, 1, [3])],
                                     4, decode_kernel=kernel).decode
    assert mixed.token_index.tolist() == [3, 6]  # flat rows of the two decodes
    assert mixed.block_tables.tolist() == [[1, 2], [3, 0]]
    assert mixed.context_lens.tolist() == [8, 3]
    with pytest.raises(ValueError, match="the decode kernel runs on CPU; this step is for meta"):
        build_attention_metadata([(0, 1, [0])], 4, "meta", decode_kernel=kernel)


@pytest.mark.parametrize("window", [None, 5])
def test_decode_only_metadata_equals_the_general_path(kernel, window):
    """A step of decodes alone takes a shortcut (every index from Python ints): each index equals
    the general path's, with and without a sliding window; bad tables are still refused."""
    chunks = [(7, 1, [1, 2, 9]), (2, 1, [3]), (12, 1, [4, 6, 8, 5]), (0, 1, [11])]
    fast = build_attention_metadata(chunks, 4, decode_kernel=kernel, sliding_window=window)
    general = build_attention_metadata(chunks, 4, sliding_window=window)
    for name in ("positions", "slot_mapping", "query_start_loc", "context_lens", "block_tables",
                 "last_token_index"):
        assert torch.equal(getattr(fast, name), getattr(general, name)), name
    assert (fast.num_tokens, fast.num_seqs, fast.prefills) == (4, 4, [])
    assert fast.slot_mapping.tolist() == [2 * 4 + 3, 3 * 4 + 2, 5 * 4 + 0, 11 * 4]
    dec = fast.decode
    assert dec.token_index is None and dec.kernel is kernel
    assert torch.equal(dec.context_lens, general.context_lens)
    assert torch.equal(dec.block_tables, general.block_tables)
    assert dec.window_starts is None  # the full-attention layers'
    if window is None:
        assert fast.windowed is None
    else:  # the windowed layers' own metadata: first key of each window
        assert fast.windowed.decode.window_starts.tolist() == [3, 0, 8, 0]
        assert torch.equal(fast.windowed.slot_mapping, general.slot_mapping)
    with pytest.raises(ValueError, match="block ids must be >= 0"):
        build_attention_metadata([(0, 1, [-1])], 4, decode_kernel=kernel)
    with pytest.raises(ValueError, match="chunk 1: block table has 1 blocks"):
        build_attention_metadata([(0, 1, [0]), (4, 1, [1])], 4, decode_kernel=kernel)


def _inputs() -> dict:
    hq, hkv, d, bs = 4, 2, 32, 4
    return {"q": torch.randn(2, hq, d), "kv_cache": torch.randn(2, hkv, 10, bs, d),
            "block_tables": torch.tensor([[1, 2], [3, 0]]), "context_lens": torch.tensor([8, 3]),
            "scale": d ** -0.5, "out": torch.empty(2, hq, d)}


@pytest.mark.parametrize(("change", "match"), [
    ({"q": torch.randn(2, 4, 32, dtype=torch.float64)}, "must be float32 and kv_cache float32 "
                                                        "or float16, got torch.float64"),
    ({"kv_cache": torch.randn(2, 2, 10, 4, 32, dtype=torch.bfloat16)},
     "kv_cache float32 or float16, got torch.float32, torch.float32, torch.bfloat16"),
    ({"kv_cache": torch.randn(2, 2, 10, 32, 4).transpose(3, 4)}, "kv_cache must be a contig"),
    ({"kv_cache": torch.randn(3, 2, 10, 4, 32)}, r"kv_cache must be .* shape \(3, 2, 10, 4, 32"),
    ({"q": torch.randn(2, 32, 4).transpose(1, 2)}, r"q must be \[T, Hq, 32\] with each row"),
    ({"q": torch.randn(2, 4, 16), "out": torch.empty(2, 4, 16)}, r"q must be \[T, Hq, 32\]"),
    ({"q": torch.randn(2, 3, 32), "out": torch.empty(2, 3, 32)}, "3 query heads do not divide"),
    ({"out": torch.empty(2, 4, 32).transpose(0, 1)}, "out must be contiguous"),
    ({"block_tables": torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)}, "block_tables must"),
    ({"context_lens": torch.tensor([8, 3, 1])}, r"context_lens must be a contiguous int64 \[2\]"),
    ({"block_tables": torch.tensor([[1, 10], [3, 0]])}, "a block id is outside the KV cache"),
    ({"block_tables": torch.tensor([[1, -1], [3, 0]])}, "a block id is outside the KV cache"),
    ({"context_lens": torch.tensor([9, 3])}, "context length is < 1 or longer than its block"),
    ({"context_lens": torch.tensor([8, 0])}, "context length is < 1"),
    ({"q": torch.randn(1, 4, 32), "out": torch.empty(1, 4, 32)}, "a row index is outside"),
])
def test_bad_inputs_get_specific_errors(kernel, change, match):
    args = _inputs() | change
    with pytest.raises(DecodeKernelError, match=match):
        kernel(**args)


def test_bad_rows_get_specific_errors(kernel):
    args = _inputs()
    with pytest.raises(DecodeKernelError, match="a row index is outside q/out"):
        kernel(**args, rows=torch.tensor([0, 2]))
    with pytest.raises(DecodeKernelError, match=r"rows must be a contiguous int64 \[2\]"):
        kernel(**args, rows=torch.tensor([0]))

"""Attention metadata (slots, groups, validation) and paged attention against a direct
softmax(QK^T)V reference over each sequence's full history."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from aioengine.worker.attention import build_attention_metadata, paged_attention
from aioengine.worker.attention.buckets import decode_buckets


def test_slot_mapping_positions_and_offsets():
    meta = build_attention_metadata([(0, 3, [5]), (5, 2, [2, 7]), (4, 1, [9, 3])], 4)
    assert meta.positions.tolist() == [0, 1, 2, 5, 6, 4]
    assert meta.slot_mapping.tolist() == [20, 21, 22, 29, 30, 12]
    assert meta.query_start_loc.tolist() == [0, 3, 5, 6]
    assert meta.context_lens.tolist() == [3, 7, 5]
    assert meta.last_token_index.tolist() == [2, 4, 5]
    assert meta.block_tables.tolist() == [[5, 0], [2, 7], [9, 3]]
    assert meta.decode.token_index.tolist() == [5]
    [bucket] = meta.decode.buckets
    assert (bucket.lo, bucket.hi) == (0, 1)
    assert bucket.blocks.tolist() == [[9, 3]]
    assert bucket.mask.dtype == torch.float32
    assert bucket.mask.view(-1).tolist() == [0.0] * 5 + [-math.inf] * 3


def test_decode_only_step_needs_no_scatter():
    meta = build_attention_metadata([(7, 1, [1, 2]), (2, 1, [3])], 4)
    assert meta.prefills == [] and meta.decode.token_index is None
    [bucket] = meta.decode.buckets
    assert bucket.blocks.tolist() == [[1, 2], [3, 0]]
    assert (bucket.mask[:, 0, 0] == 0).tolist() == [[True] * 8, [True] * 3 + [False] * 5]


def test_decodes_split_into_length_buckets():
    # Two short and two long contexts (blocks of 4): padding the short ones to 40 keys would
    # waste 2 * 36 keys, more than a bucket costs here.
    chunks = [(39, 1, list(range(10))), (2, 1, [10]), (38, 1, list(range(11, 21))),
              (0, 1, [21])]
    dec = build_attention_metadata(chunks, 4, bucket_cost=16).decode
    assert dec.token_index.tolist() == [1, 3, 0, 2]  # shortest bucket first
    short, long = dec.buckets
    assert (short.lo, short.hi, long.lo, long.hi) == (0, 2, 2, 4)
    assert short.blocks.tolist() == [[10], [21]]
    assert (short.mask[:, 0, 0] == 0).tolist() == [[True] * 3 + [False], [True] + [False] * 3]
    assert long.blocks.tolist() == [list(range(10)), list(range(11, 21))]
    assert (long.mask[:, 0, 0] == 0).sum(1).tolist() == [40, 39]
    # The same step with a dearer bucket: one padded batch in the original order.
    dec = build_attention_metadata(chunks, 4, bucket_cost=100).decode
    assert dec.token_index is None and [b.blocks.shape for b in dec.buckets] == [(4, 10)]
    # Mixed with a prefill: the decode rows are gathered, in bucket order.
    dec = build_attention_metadata([(0, 3, [30]), *chunks], 4, bucket_cost=16).decode
    assert dec.token_index.tolist() == [4, 6, 3, 5]


def test_prefill_grouping():
    lone = build_attention_metadata([(0, 5, [1, 2])], 4).prefills
    assert len(lone) == 1 and lone[0].blocks is None and lone[0].token_slice == (0, 5)
    prefixed = build_attention_metadata([(4, 3, [1, 2, 7])], 4).prefills
    assert prefixed[0].blocks.tolist() == [[1, 2]]
    assert prefixed[0].mask[0, 0].tolist() == [[True] * r + [False] * (8 - r) for r in (5, 6, 7)]
    similar = build_attention_metadata([(0, 5, [1, 2]), (0, 6, [3, 4])], 4).prefills
    assert len(similar) == 1 and similar[0].num_seqs == 2 and similar[0].max_q == 6
    uneven = build_attention_metadata([(0, 40, list(range(10))), (0, 2, [11]),
                                       (0, 3, [12])], 4).prefills
    assert [g.num_seqs for g in uneven] == [1, 1, 1]


@pytest.mark.parametrize(("chunks", "match"), [
    ([], "at least one chunk"),
    ([(0, 0, [1])], "num_tokens >= 1"),
    ([(-1, 2, [1])], "start_pos must be >= 0"),
    ([(3, 3, [1])], "chunk 0: block table has 1 blocks .* needs 2 blocks"),
    ([(0, 2, [1]), (0, 1, [-4])], "block ids must be >= 0"),
])
def test_bad_chunks_are_rejected(chunks, match):
    with pytest.raises(ValueError, match=match):
        build_attention_metadata(chunks, 4)


def test_bad_block_size():
    with pytest.raises(ValueError, match="block_size must be positive"):
        build_attention_metadata([(0, 1, [0])], 0)


def test_bad_bucket_cost():
    with pytest.raises(ValueError, match="bucket_cost must be >= 0, got -1"):
        build_attention_metadata([(0, 1, [0])], 4, bucket_cost=-1)


def _partition_cost(buckets, nblocks, block_size, cost):
    return sum(len(b) * max(nblocks[i] for i in b) * block_size + cost for b in buckets)


def _brute_force_cost(nblocks, block_size, cost):
    """Every split of the length-sorted sequences into runs."""
    order = sorted(range(len(nblocks)), key=nblocks.__getitem__)
    best = None
    for mask in range(1 << (len(order) - 1)):
        cuts = [i + 1 for i in range(len(order) - 1) if mask >> i & 1]
        bounds = [0, *cuts, len(order)]
        buckets = [order[a:b] for a, b in itertools.pairwise(bounds)]
        total = _partition_cost(buckets, nblocks, block_size, cost)
        best = total if best is None else min(best, total)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_decode_buckets_are_optimal(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 11)
    nblocks = [rng.choice([1, 2, 3, 5, 8, 13, 30, 31, 60]) for _ in range(n)]
    block_size = rng.choice([1, 4, 16])
    cost = rng.choice([0, 1, 16, 64, 128, 1000])
    ids = list(range(n))
    buckets = decode_buckets(ids, nblocks, block_size, cost)
    assert sorted(i for b in buckets for i in b) == ids  # a partition
    assert _partition_cost(buckets, nblocks, block_size, cost) == _brute_force_cost(
        nblocks, block_size, cost)
    if len(buckets) == 1:
        assert buckets[0] == ids  # one bucket keeps the batch order


def test_decode_buckets_edges():
    assert decode_buckets([], [], 16) == []
    assert decode_buckets([3], [0, 0, 0, 7], 16) == [[3]]
    assert decode_buckets([2, 0, 1], [5, 5, 5], 16, cost=0) == [[2, 0, 1]]  # equal lengths
    # Free buckets: one per distinct length, shortest first.
    assert decode_buckets([0, 1, 2, 3], [9, 1, 9, 4], 16, cost=0) == [[1], [3], [0, 2]]


def _reference(q, keys, values, start, scale):
    """q [n, Hq, D] at positions start.., keys/values [L, Hkv, D] of the whole history."""
    group = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).double()
    v = values.repeat_interleave(group, dim=1).double()
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    pos = torch.arange(q.shape[0])[:, None] + start
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()


@pytest.mark.parametrize(("seed", "bucket_cost"), [(0, 0), (1, 0), (2, 8), (3, 128)])
def test_paged_attention_matches_reference(seed, bucket_cost):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    hq, hkv, d, bs, nblocks = 4, 2, 8, 4, 64
    cache = torch.zeros(2, hkv, nblocks, bs, d)
    free = list(range(nblocks))
    rng.shuffle(free)
    lengths = [rng.randint(1, 30) for _ in range(6)]
    done = [0] * 6
    tables: list[list[int]] = [[] for _ in range(6)]
    history_k = [torch.empty(0, hkv, d) for _ in range(6)]
    history_v = [torch.empty(0, hkv, d) for _ in range(6)]
    while any(done[i] < lengths[i] for i in range(6)):
        plan = []
        for i in rng.sample(range(6), 6):
            if done[i] < lengths[i] and rng.random() < 0.7:
                plan.append((i, rng.randint(1, lengths[i] - done[i])))
        if not plan:
            continue
        chunks = []
        for i, n in plan:
            while len(tables[i]) * bs < done[i] + n:
                tables[i].append(free.pop())
            chunks.append((done[i], n, list(tables[i])))
        total = sum(n for _, n in plan)
        q = torch.randn(total, hq, d, generator=gen)
        k = torch.randn(total, hkv, d, generator=gen)
        v = torch.randn(total, hkv, d, generator=gen)
        meta = build_attention_metadata(chunks, bs, bucket_cost=bucket_cost)
        out = paged_attention(q, k, v, cache, meta, scale=d ** -0.5)
        row = 0
        for i, n in plan:
            history_k[i] = torch.cat([history_k[i], k[row:row + n]])
            history_v[i] = torch.cat([history_v[i], v[row:row + n]])
            ref = _reference(q[row:row + n], history_k[i], history_v[i], done[i], d ** -0.5)
            torch.testing.assert_close(out[row:row + n], ref, atol=1e-5, rtol=1e-5)
            done[i] += n
            row += n


def test_decode_spans_take_single_runs_long_enough():
    chunks = [(39, 1, list(range(10))),  # one run, 40 keys: a span
              (39, 1, [20, 21, 23, 22, 24, 25, 26, 27, 28, 29]),  # not in order: gathered
              (2, 1, [40]),  # a run, but 3 keys: gathered
              (0, 3, [50]),  # a prefill: never a span
              (20, 1, [60, 61, 62, 63, 64, 65, 99])]  # a run over the 6 blocks it needs
    dec = build_attention_metadata(chunks, 4, span_min_keys=8).decode
    assert dec.spans == [(0, 40), (240, 21)]
    assert dec.token_index.tolist()[:2] == [0, 6]  # the spans' rows come first
    assert sorted(dec.token_index.tolist()[2:]) == [1, 2]
    assert dec.buckets[0].lo == 2 and dec.buckets[-1].hi == 4
    assert build_attention_metadata(chunks, 4, span_min_keys=None).decode.spans == []
    assert build_attention_metadata(chunks, 4, span_min_keys=41).decode.spans == []
    # A pure decode step of spans only, in order: no scatter.
    only = build_attention_metadata([chunks[0], chunks[4]], 4, span_min_keys=8).decode
    assert only.token_index is None and only.buckets == [] and len(only.spans) == 2


@pytest.mark.parametrize("bad", [0, -2])
def test_bad_span_min_keys(bad):
    with pytest.raises(ValueError, match=f"span_min_keys must be >= 1, None or -1, got {bad}"):
        build_attention_metadata([(0, 1, [0])], 4, span_min_keys=bad)


@pytest.mark.parametrize(("seed", "span_min_keys"), [(0, 1), (1, 6), (2, 1), (3, None)])
def test_spans_and_buckets_mixed_match_reference(seed, span_min_keys):
    """Half the sequences hold one run of blocks (attended in place), half scattered blocks
    (gathered), some with prefills in the same steps; every output against the reference."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    hq, hkv, d, bs, n = 6, 2, 8, 4, 8
    cache = torch.zeros(2, hkv, 200, bs, d)
    scattered = list(range(100, 200))
    rng.shuffle(scattered)
    lengths = [rng.randint(2, 40) for _ in range(n)]
    tables = [list(range(i * 12, i * 12 + 10)) if i % 2 else
              [scattered.pop() for _ in range(10)] for i in range(n)]
    done = [0] * n
    hist_k = [torch.empty(0, hkv, d) for _ in range(n)]
    hist_v = [torch.empty(0, hkv, d) for _ in range(n)]
    spans_seen = 0
    while any(done[i] < lengths[i] for i in range(n)):
        plan = [(i, 1 if done[i] else rng.randint(1, lengths[i])) for i in range(n)
                if done[i] < lengths[i] and rng.random() < 0.8]
        if not plan:
            continue
        chunks = [(done[i], m, tables[i]) for i, m in plan]
        total = sum(m for _, m in plan)
        q = torch.randn(total, hq, d, generator=gen)
        k = torch.randn(total, hkv, d, generator=gen)
        v = torch.randn(total, hkv, d, generator=gen)
        meta = build_attention_metadata(chunks, bs, bucket_cost=rng.choice([0, 16]),
                                        span_min_keys=span_min_keys)
        spans_seen += len(meta.decode.spans) if meta.decode else 0
        out = paged_attention(q, k, v, cache, meta, scale=d ** -0.5)
        row = 0
        for i, m in plan:
            hist_k[i] = torch.cat([hist_k[i], k[row:row + m]])
            hist_v[i] = torch.cat([hist_v[i], v[row:row + m]])
            ref = _reference(q[row:row + m], hist_k[i], hist_v[i], done[i], d ** -0.5)
            torch.testing.assert_close(out[row:row + m], ref, atol=1e-5, rtol=1e-5)
            done[i] += m
            row += m
    assert (spans_seen > 0) == (span_min_keys is not None)


def test_sliding_window_metadata():
    """Window 3: the decode at position 7 sees keys 5..7, a fresh 5-token prefill gets a banded
    causal mask, no spans; window_only builds one metadata that is its own ``windowed``."""
    chunks = [(7, 1, [1, 2]), (0, 5, [3, 4])]
    meta = build_attention_metadata(chunks, 4, sliding_window=3)
    assert meta.decode.spans == [] and meta.windowed.decode.spans == []
    full, win = meta.decode.buckets[0].mask, meta.windowed.decode.buckets[0].mask
    assert (full[0, 0, 0] == 0).tolist() == [True] * 8
    assert (win[0, 0, 0] == 0).tolist() == [False] * 5 + [True] * 3
    assert meta.prefills[0].mask is None  # full layers: SDPA's is_causal
    band = meta.windowed.prefills[0].mask
    assert band[4].tolist() == [False, False, True, True, True] and band[0, 0]
    only = build_attention_metadata(chunks, 4, sliding_window=3, window_only=True)
    assert only.windowed is only and torch.equal(only.decode.buckets[0].mask, win)
    moved = build_attention_metadata(chunks, 4, "meta", sliding_window=3, window_only=True)
    assert moved.windowed is moved and moved.positions.device.type == "meta"
    with pytest.raises(ValueError, match="sliding_window must be >= 1, got 0"):
        build_attention_metadata(chunks, 4, sliding_window=0)

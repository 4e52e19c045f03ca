"""Per-step attention metadata, built once from the step's chunks and shared by every layer.

A step is a flat batch of T tokens: chunk i contributes ``num_tokens`` tokens at positions
``start_pos .. start_pos+num_tokens-1`` of its sequence, whose KV lives in the blocks of its
``block_table`` (slot of position p = ``block_table[p // block_size] * block_size +
p % block_size``). Chunks of one token (decodes) go to the compiled CPU kernel when the step
has one (every decode in one call per layer, its blocks read in place). Without it, decodes
whose blocks form one run of adjacent ids are attended on a view of the cache (a "span", no
copy); the other decodes in padded buckets of similar length (``decode_buckets``), gathered
block by block. Longer chunks (prefills) go in padded groups, or alone when padding would
waste too much. Everything here is vectorised
tensor work; the only Python loops are over chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from aioengine.worker.attention.buckets import DECODE_BUCKET_COST, decode_buckets

if TYPE_CHECKING:
    from aioengine.worker.attention.cpu_kernel import PagedDecodeKernel

Chunk = tuple[int, int, Sequence[int]]
"""``(start_pos, num_tokens, block_table)`` of one sequence in this step."""

# A padded prefill group may cost at most this many times the useful attention work.
_MAX_PADDING_WASTE = 2.0

# Shortest context attended as a span on CPU: below it, one more SDPA call per layer (a fixed
# dispatch cost) costs more than gathering the sequence into a bucket; above it, reading the KV
# where it lies beats copying it. Not tuned finely (docs/benchmarks.md).
DECODE_SPAN_MIN_KEYS = 64


@dataclass
class DecodeBucket:
    """Decodes of similar context length, rows ``lo:hi`` of the decode batch, padded together:
    keys gathered whole blocks at a time, ``blocks`` ``[n, nb]``, giving ``L = nb *
    block_size`` key positions per sequence (tail masked)."""

    lo: int
    hi: int
    blocks: torch.Tensor  # [n, nb] block ids (padding points at a real block, masked out)
    # [n, 1, 1, L] float32, added to the scores: 0 = attend, -inf = past the context. Not bool:
    # SDPA would turn a bool mask into this in every layer.
    mask: torch.Tensor


@dataclass
class DecodeGroup:
    """All one-token chunks. With ``kernel``: in chunk order, all in one kernel call per layer
    over ``block_tables``/``context_lens`` (no spans, no buckets). Without: first the spans,
    then bucket by bucket (see ``buckets.decode_buckets``; bucket rows ``lo:hi`` count the
    spans before them)."""

    token_index: torch.Tensor | None  # [B] rows of the flat batch; None: all T rows, in order
    buckets: list[DecodeBucket]
    # Row i < len(spans): keys are the slots ``first:first + length`` of the cache, one run of
    # blocks, viewed in place.
    spans: list[tuple[int, int]] = field(default_factory=list)
    kernel: PagedDecodeKernel | None = None
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int64, with the kernel
    context_lens: torch.Tensor | None = None  # [B] int64, with the kernel
    window_starts: torch.Tensor | None = None  # [B] int64 first key, sliding window + kernel


@dataclass
class PrefillGroup:
    """Multi-token chunks attended in one SDPA call.

    One chunk: queries are the contiguous rows ``token_slice``. Several: ``token_index`` gathers
    them padded to ``[P, max_q]``; ``valid_rows`` picks the real rows of that padded
    layout and ``out_index`` says where each goes in the flat batch.
    ``blocks`` is None for a lone chunk starting at position 0: its keys are exactly its own
    fresh k/v (just written to the cache), so it attends to them directly with a causal mask
    (``mask`` ``[n, n]`` bool when a sliding window cuts it, else None: SDPA's is_causal).
    """

    num_seqs: int
    max_q: int
    token_slice: tuple[int, int] | None
    token_index: torch.Tensor | None  # [P * max_q]
    valid_rows: torch.Tensor | None  # [n_valid] rows of the padded [P * max_q] layout
    out_index: torch.Tensor | None  # [n_valid] rows of the flat batch
    blocks: torch.Tensor | None  # [P, nb], L = nb * block_size keys
    mask: torch.Tensor | None  # [P, 1, max_q, L] bool, causal within the chunk


@dataclass
class AttentionMetadata:
    num_tokens: int
    num_seqs: int
    block_size: int
    positions: torch.Tensor  # [T] position of each token in its sequence
    slot_mapping: torch.Tensor  # [T] cache slot each token's k/v is written to
    query_start_loc: torch.Tensor  # [N + 1] offsets of each chunk in the flat batch
    context_lens: torch.Tensor  # [N] start_pos + num_tokens
    block_tables: torch.Tensor  # [N, max_blocks] padded with block 0
    last_token_index: torch.Tensor  # [N] flat row of each chunk's last token
    decode: DecodeGroup | None
    prefills: list[PrefillGroup]
    # With ``sliding_window=W``: the same step for layers where the query at position p sees
    # only keys p - W + 1 .. p (its decode and prefill groups; positions and slots shared).
    windowed: AttentionMetadata | None = None


def build_attention_metadata(chunks: Sequence[Chunk], block_size: int,
                             device: torch.device | str = "cpu", *,
                             bucket_cost: int = DECODE_BUCKET_COST,
                             span_min_keys: int | None = -1,
                             decode_kernel: PagedDecodeKernel | None = None,
                             sliding_window: int | None = None,
                             window_only: bool = False) -> AttentionMetadata:
    """Validate the chunks and precompute every index and mask a forward pass needs.
    ``decode_kernel``: attend every decode with this compiled CPU kernel (see ``cpu_kernel``;
    CPU only), so no spans or buckets are built.
    ``bucket_cost``: see ``decode_buckets`` (0 splits decodes at every distinct length).
    ``span_min_keys``: shortest decode context attended as a span; None: never (gather every
    decode); -1: ``DECODE_SPAN_MIN_KEYS`` on CPU, never elsewhere (on a GPU a gather is cheap
    next to one more kernel launch per sequence).
    ``sliding_window``: also build ``windowed`` (see AttentionMetadata); with ``window_only``
    (every layer windowed) only that one, which is then its own ``windowed``."""
    if sliding_window is not None:
        if sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
        if window_only:
            meta = _build(chunks, block_size, bucket_cost, None, decode_kernel, sliding_window)
            meta.windowed = meta
            return meta if torch.device(device).type == "cpu" else _to_device(meta, device)
        meta = build_attention_metadata(chunks, block_size, "cpu", bucket_cost=bucket_cost,
                                        span_min_keys=span_min_keys,
                                        decode_kernel=decode_kernel)
        meta.windowed = _build(chunks, block_size, bucket_cost, None, decode_kernel,
                               sliding_window)
        return meta if torch.device(device).type == "cpu" else _to_device(meta, device)
    return _build(chunks, block_size, bucket_cost, span_min_keys, decode_kernel, None, device)


def _build(chunks: Sequence[Chunk], block_size: int, bucket_cost: int,
           span_min_keys: int | None, decode_kernel: PagedDecodeKernel | None,
           window: int | None, device: torch.device | str = "cpu") -> AttentionMetadata:
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if bucket_cost < 0:
        raise ValueError(f"bucket_cost must be >= 0, got {bucket_cost}")
    if span_min_keys == -1:
        span_min_keys = DECODE_SPAN_MIN_KEYS if torch.device(device).type == "cpu" else None
    elif span_min_keys is not None and span_min_keys < 1:
        raise ValueError(f"span_min_keys must be >= 1, None or -1, got {span_min_keys}")
    if not chunks:
        raise ValueError("a step needs at least one chunk")
    if decode_kernel is not None and torch.device(device).type != "cpu":
        raise ValueError(f"the decode kernel runs on CPU; this step is for {device}")
    starts: list[int] = []
    lens: list[int] = []
    ctxs: list[int] = []
    max_blocks = 1
    tables: list[Sequence[int]] = []
    for i, (start, num, table) in enumerate(chunks):
        if start < 0 or num < 1:
            raise ValueError(f"chunk {i}: start_pos must be >= 0 and num_tokens >= 1, got "
                             f"start_pos={start}, num_tokens={num}")
        ctx = start + num
        needed = -(-ctx // block_size)
        if len(table) < needed:
            raise ValueError(f"chunk {i}: block table has {len(table)} blocks "
                             f"({len(table) * block_size} slots) but the chunk ends at "
                             f"position {ctx - 1}; needs {needed} blocks of {block_size}")
        starts.append(start)
        lens.append(num)
        ctxs.append(ctx)
        tables.append(table[:needed])
        max_blocks = max(max_blocks, needed)
    flat: list[int] = []
    pad = [0] * max_blocks
    for t in tables:
        flat.extend(t)
        flat.extend(pad[:max_blocks - len(t)])
    if flat and min(flat) < 0:
        raise ValueError("block ids must be >= 0")

    n = len(chunks)
    if decode_kernel is not None and max(lens) == 1:
        return _kernel_decodes(starts, tables, flat, max_blocks, block_size, decode_kernel,
                               window)
    start_t = torch.tensor(starts, dtype=torch.long)
    len_t = torch.tensor(lens, dtype=torch.long)
    ctx_t = start_t + len_t
    table_t = torch.tensor(flat, dtype=torch.long).view(n, max_blocks)
    qsl = torch.zeros(n + 1, dtype=torch.long)
    torch.cumsum(len_t, 0, out=qsl[1:])
    total = int(qsl[-1])
    seq_of_token = torch.repeat_interleave(torch.arange(n), len_t)
    positions = torch.arange(total) - qsl[:-1][seq_of_token] + start_t[seq_of_token]
    slot_mapping = (table_t[seq_of_token, positions // block_size] * block_size
                    + positions % block_size)

    decode_ids = [i for i in range(n) if lens[i] == 1]
    prefill_ids = [i for i in range(n) if lens[i] > 1]
    decode = None
    if decode_ids and decode_kernel is not None:
        decode = _kernel_decode_group(decode_ids, total, qsl, table_t, ctx_t, decode_kernel)
        if window is not None:
            assert decode.context_lens is not None
            decode.window_starts = (decode.context_lens - window).clamp(min=0)
    elif decode_ids:
        span_ids: list[int] = []
        if span_min_keys is not None and window is None:
            span_ids = [i for i in decode_ids if ctxs[i] >= span_min_keys and _is_run(tables[i])]
            if span_ids:
                spanned = set(span_ids)
                decode_ids = [i for i in decode_ids if i not in spanned]
        buckets = decode_buckets(decode_ids, [-(-c // block_size) for c in ctxs], block_size,
                                 bucket_cost)
        decode = _decode_group(span_ids, buckets, ctxs, total, qsl, table_t, ctx_t, block_size,
                               window)
        decode.spans = [(tables[i][0] * block_size, ctxs[i]) for i in span_ids]
    prefills = [_prefill_group(g, starts, lens, qsl, table_t, ctx_t, block_size, window)
                for g in _group_prefills(prefill_ids, starts, lens)]

    meta = AttentionMetadata(
        num_tokens=total, num_seqs=n, block_size=block_size, positions=positions,
        slot_mapping=slot_mapping, query_start_loc=qsl, context_lens=ctx_t,
        block_tables=table_t, last_token_index=qsl[1:] - 1, decode=decode, prefills=prefills)
    return meta if torch.device(device).type == "cpu" else _to_device(meta, device)


def _kernel_decodes(starts: list[int], tables: list[Sequence[int]], flat: list[int],
                    max_blocks: int, block_size: int, kernel: PagedDecodeKernel,
                    window: int | None) -> AttentionMetadata:
    """A step of decodes only, for the compiled kernel (so on CPU): every index from Python
    ints, one tensor each. The general path's ~20 small tensor ops each pay torch's dispatch,
    a visible share of a batch-1 decode step (docs/benchmarks.md)."""
    n = len(starts)
    slots = [t[s // block_size] * block_size + s % block_size for s, t in zip(starts, tables,
                                                                            strict=True)]
    ctx_t = torch.tensor([s + 1 for s in starts], dtype=torch.long)
    decode = DecodeGroup(None, [], kernel=kernel,
                         block_tables=torch.tensor(flat, dtype=torch.long).view(n, max_blocks),
                         context_lens=ctx_t)
    if window is not None:
        decode.window_starts = (ctx_t - window).clamp(min=0)
    return AttentionMetadata(
        num_tokens=n, num_seqs=n, block_size=block_size,
        positions=torch.tensor(starts, dtype=torch.long),
        slot_mapping=torch.tensor(slots, dtype=torch.long), query_start_loc=torch.arange(n + 1),
        context_lens=ctx_t, block_tables=decode.block_tables, last_token_index=torch.arange(n),
        decode=decode, prefills=[])


def _gather_layout(tables: torch.Tensor, ctx: torch.Tensor,
                   block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks ``[B, nb]`` covering the longest context, and a key mask ``[B, nb*block_size]``
    (gathering whole blocks: 1/block_size as many indices as gathering slots)."""
    nblocks = -(-int(ctx.max()) // block_size)
    blocks = tables[:, :nblocks].contiguous()
    mask = torch.arange(nblocks * block_size)[None, :] < ctx[:, None]
    return blocks, mask


def _is_run(table: Sequence[int]) -> bool:
    """The blocks are adjacent ids, in order: their slots are one contiguous range."""
    first = table[0]
    # Compared as lists in C: a generator over the blocks runs Python per block, per decode,
    # every step.
    return list(table) == list(range(first, first + len(table)))


def _kernel_decode_group(ids: list[int], total: int, qsl: torch.Tensor, tables: torch.Tensor,
                         ctx: torch.Tensor, kernel: PagedDecodeKernel) -> DecodeGroup:
    """The decodes in chunk order, for one kernel call: its tables, lengths and token rows."""
    if len(ids) == total:  # every chunk is a decode: rows 0..B-1, tables as they are
        return DecodeGroup(None, [], kernel=kernel, block_tables=tables, context_lens=ctx)
    idx = torch.tensor(ids, dtype=torch.long)
    return DecodeGroup(qsl[idx], [], kernel=kernel, block_tables=tables[idx],
                       context_lens=ctx[idx])


def _decode_group(span_ids: list[int], buckets: list[list[int]], ctxs: list[int], total: int,
                  qsl: torch.Tensor, tables: torch.Tensor, ctx: torch.Tensor,
                  block_size: int, window: int | None = None) -> DecodeGroup:
    """Tables and lengths permuted into bucket order once; each bucket slices them."""
    order = span_ids + [i for b in buckets for i in b]
    if order == list(range(len(order))):  # also when every chunk is a decode, in order
        idx = None
        tables, ctx = tables[:len(order)], ctx[:len(order)]
    else:
        idx = torch.tensor(order, dtype=torch.long)
        tables, ctx = tables[idx], ctx[idx]
    keys = torch.arange(tables.shape[1] * block_size)
    attend = torch.zeros((), dtype=torch.float32)
    skip = torch.full((), float("-inf"), dtype=torch.float32)
    out, lo = [], len(span_ids)
    for b in buckets:
        n = len(b)
        nb = -(-max(ctxs[i] for i in b) // block_size)
        hi = lo + n
        seen = keys[:nb * block_size] < ctx[lo:hi, None]
        if window is not None:  # the query at ctx - 1 sees keys ctx - window .. ctx - 1
            seen &= keys[:nb * block_size] >= ctx[lo:hi, None] - window
        mask = torch.where(seen, attend, skip)
        out.append(DecodeBucket(lo, hi, tables[lo:hi, :nb], mask.view(n, 1, 1, -1)))
        lo = hi
    rows = None if idx is None and len(order) == total else qsl[order]
    return DecodeGroup(token_index=rows, buckets=out)


def _group_prefills(ids: list[int], starts: list[int], lens: list[int]) -> list[list[int]]:
    """One padded group when that wastes little, else one group per chunk."""
    if len(ids) <= 1:
        return [ids] if ids else []
    useful = sum(lens[i] * (starts[i] + lens[i]) for i in ids)
    padded = len(ids) * max(lens[i] for i in ids) * max(starts[i] + lens[i] for i in ids)
    if padded <= _MAX_PADDING_WASTE * useful:
        return [ids]
    return [[i] for i in ids]


def _prefill_group(ids: list[int], starts: list[int], lens: list[int], qsl: torch.Tensor,
                   tables: torch.Tensor, ctx: torch.Tensor, block_size: int,
                   window: int | None = None) -> PrefillGroup:
    if len(ids) == 1:
        i = ids[0]
        begin = int(qsl[i])
        span = (begin, begin + lens[i])
        if starts[i] == 0:
            own = None
            if window is not None and lens[i] > window:
                r = torch.arange(lens[i])
                own = (r[None, :] <= r[:, None]) & (r[None, :] > r[:, None] - window)
            return PrefillGroup(1, lens[i], span, None, None, None, None, own)
    # (one chunk over a cached prefix, or several chunks: keys come from the cache)
    idx = torch.tensor(ids, dtype=torch.long)
    lens_g = torch.tensor([lens[i] for i in ids], dtype=torch.long)
    starts_g = torch.tensor([starts[i] for i in ids], dtype=torch.long)
    max_q = int(lens_g.max())
    rows = torch.arange(max_q)
    valid = rows[None, :] < lens_g[:, None]  # [P, max_q]
    blocks, _ = _gather_layout(tables[idx], ctx[idx], block_size)
    # Query r of chunk p sees keys 0..start_p + r; padding rows see key 0 only (never all-masked,
    # which would give NaN), and are dropped afterwards.
    limit = torch.where(valid, starts_g[:, None] + rows[None, :], 0)
    keys = torch.arange(blocks.shape[1] * block_size)
    mask = keys[None, None, :] <= limit[:, :, None]
    if window is not None:
        mask &= keys[None, None, :] > limit[:, :, None] - window
    mask = mask.unsqueeze(1)
    if len(ids) == 1:
        return PrefillGroup(1, max_q, span, None, None, None, blocks, mask)
    token_index = torch.where(valid, qsl[idx][:, None] + rows[None, :], 0).reshape(-1)
    valid_rows = valid.reshape(-1).nonzero().squeeze(1)
    return PrefillGroup(len(ids), max_q, None, token_index, valid_rows,
                        token_index[valid_rows], blocks, mask)


def _to_device(meta: AttentionMetadata, device: torch.device | str) -> AttentionMetadata:
    def mv(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device, non_blocking=True)

    decode = meta.decode
    if decode is not None:
        decode = DecodeGroup(mv(decode.token_index), [
            DecodeBucket(b.lo, b.hi, mv(b.blocks), mv(b.mask)) for b in decode.buckets],
            decode.spans)
    windowed = None
    if meta.windowed is not None and meta.windowed is not meta:
        windowed = _to_device(meta.windowed, device)
    prefills = [PrefillGroup(g.num_seqs, g.max_q, g.token_slice, mv(g.token_index),
                             mv(g.valid_rows), mv(g.out_index), mv(g.blocks), mv(g.mask))
                for g in meta.prefills]
    moved = AttentionMetadata(
        num_tokens=meta.num_tokens, num_seqs=meta.num_seqs, block_size=meta.block_size,
        positions=mv(meta.positions), slot_mapping=mv(meta.slot_mapping),
        query_start_loc=mv(meta.query_start_loc), context_lens=mv(meta.context_lens),
        block_tables=mv(meta.block_tables), last_token_index=mv(meta.last_token_index),
        decode=decode, prefills=prefills, windowed=windowed)
    if meta.windowed is meta:
        moved.windowed = moved
    return moved

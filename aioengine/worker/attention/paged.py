"""Paged attention: write this step's k/v into the cache, then attend. Prefills (and every
decode on GPU or in half precision) use torch SDPA; CPU float32 decodes the compiled kernel of
``cpu_kernel`` when the step's metadata carries one, SDPA on spans and buckets otherwise.

KV cache of one layer: ``[2, num_kv_heads, num_blocks, block_size, head_dim]`` (k, v). Heads
outermost so that gathered keys ``[B, Hkv, L, D]`` have contiguous ``[L, D]`` matrices: SDPA
over the previous ``[B, L, Hkv, D]`` layout read strided rows and was much slower on CPU at long
contexts (docs/benchmarks.md).
A slot (``block * block_size + offset``) addresses one token's k or v within a head.
The cache may be stored in another dtype than the model computes in (``kv_cache_dtype``: a
float16 cache for a float32 model on CPU): k/v are rounded when written and widened when read.
Grouped-query attention: query head h uses kv head ``h // (num_heads // num_kv_heads)``
(the Hugging Face ``repeat_kv`` convention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aioengine.worker.attention.metadata import (
    AttentionMetadata,
    DecodeBucket,
    DecodeGroup,
    PrefillGroup,
)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store ``k``/``v`` ``[T, Hkv, D]`` at their slots."""
    two, hkv, num_blocks, bs, d = kv_cache.shape
    flat = kv_cache.view(two, hkv, num_blocks * bs, d)
    if k.dtype != kv_cache.dtype:
        k, v = k.to(kv_cache.dtype), v.to(kv_cache.dtype)
    flat[0].index_copy_(1, slot_mapping, k.transpose(0, 1))
    flat[1].index_copy_(1, slot_mapping, v.transpose(0, 1))


def _gather(kv_cache: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """K and V of whole blocks in ``dtype``: ``[2, B, Hkv, nb * block_size, D]``.
    ``index_select`` copies each block as one contiguous row (advanced indexing, element by
    element, was much slower on CPU; docs/benchmarks.md)."""
    two, hkv, num_blocks, bs, d = kv_cache.shape
    b, nb = blocks.shape
    rows = kv_cache.view(two * hkv, num_blocks, bs * d).index_select(1, blocks.reshape(-1))
    if rows.dtype != dtype:
        rows = rows.to(dtype)
    return rows.view(two, hkv, b, nb * bs, d).transpose(1, 2)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, write: bool = True) -> torch.Tensor:
    """``q`` ``[T, Hq, D]``, ``k``/``v`` ``[T, Hkv, D]`` of this step -> output ``[T, Hq, D]``.
    ``write=False``: k and v are already in the cache at ``meta.slot_mapping``."""
    if write:
        write_kv(kv_cache, k, v, meta.slot_mapping)
    dec = meta.decode
    if dec is not None and dec.kernel is not None:
        # Reads the decode rows of q and writes those of out in place: no gather, no scatter.
        assert dec.block_tables is not None and dec.context_lens is not None
        out = dec.kernel(q, kv_cache, dec.block_tables, dec.context_lens, scale,
                         torch.empty(q.shape, dtype=q.dtype), dec.token_index,
                         dec.window_starts)
        dec = None
    elif dec is not None and dec.token_index is None:  # pure decode step in order: no scatter
        return _decode(q, kv_cache, dec, scale)
    else:
        out = torch.empty_like(q)
    if dec is not None:
        assert dec.token_index is not None
        res = _decode(q.index_select(0, dec.token_index), kv_cache, dec, scale)
        out.index_copy_(0, dec.token_index, res)
    for group in meta.prefills:
        _prefill(q, k, v, kv_cache, group, scale, out)
    return out


def _decode(q: torch.Tensor, kv_cache: torch.Tensor, group: DecodeGroup,
            scale: float) -> torch.Tensor:
    """``q`` ``[B, Hq, D]`` in the group's order (spans, then buckets)."""
    if not group.spans and len(group.buckets) == 1:
        return _decode_bucket(q, kv_cache, group.buckets[0], scale)
    outs = _decode_spans(q, kv_cache, group.spans, scale) if group.spans else []
    outs += [_decode_bucket(q[b.lo:b.hi], kv_cache, b, scale) for b in group.buckets]
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def _decode_spans(q: torch.Tensor, kv_cache: torch.Tensor, spans: list[tuple[int, int]],
                  scale: float) -> list[torch.Tensor]:
    """One SDPA per span, on a view of the cache: the KV is read once, where it lies, instead
    of being copied into a bucket first (the copy cost more than SDPA itself on CPU). Views by
    ``narrow`` and one reshape of the joined result: slicing with ``[:, :, lo:hi]`` and a
    ``view`` per span cost measurably more per span, paid spans x layers times a step."""
    two, hkv, num_blocks, bs, d = kv_cache.shape
    b, hq = len(spans), q.shape[1]
    keys, values = kv_cache.view(two, 1, hkv, num_blocks * bs, d).unbind(0)
    qs = q[:b].view(b, 1, hkv, hq // hkv, d).unbind(0)
    sdpa = F.scaled_dot_product_attention
    if kv_cache.dtype != q.dtype:  # a cache stored narrower: widen each span as it is read
        outs = [sdpa(qi, keys.narrow(2, lo, n).to(q.dtype), values.narrow(2, lo, n).to(q.dtype),
                     scale=scale) for qi, (lo, n) in zip(qs, spans, strict=True)]
        return [torch.cat(outs).view(b, hq, d)]
    outs = [sdpa(qi, keys.narrow(2, lo, n), values.narrow(2, lo, n), scale=scale)
            for qi, (lo, n) in zip(qs, spans, strict=True)]
    return [torch.cat(outs).view(b, hq, d)]


def _decode_bucket(q: torch.Tensor, kv_cache: torch.Tensor, bucket: DecodeBucket,
                   scale: float) -> torch.Tensor:
    # One query per sequence: fold the query heads sharing a kv head into the "query length"
    # axis, [B, Hkv, G, D], so SDPA needs no repeated K/V and the mask broadcasts over G.
    b, hq, d = q.shape
    hkv = kv_cache.shape[1]
    kv = _gather(kv_cache, bucket.blocks, q.dtype)
    mask = bucket.mask if bucket.mask.dtype == q.dtype else bucket.mask.to(q.dtype)
    out = F.scaled_dot_product_attention(q.view(b, hkv, hq // hkv, d), kv[0], kv[1],
                                         attn_mask=mask, scale=scale)
    return out.reshape(b, hq, d)


def _prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
             group: PrefillGroup, scale: float, out: torch.Tensor) -> None:
    gqa = q.shape[1] != k.shape[1]
    if group.token_slice is not None:
        lo, hi = group.token_slice
        qs = q[lo:hi].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        if group.blocks is None:  # fresh sequence: its keys are this chunk's own k/v
            keys = k[lo:hi].transpose(0, 1).unsqueeze(0)
            values = v[lo:hi].transpose(0, 1).unsqueeze(0)
            res = F.scaled_dot_product_attention(qs, keys, values, attn_mask=group.mask,
                                                 is_causal=group.mask is None, scale=scale,
                                                 enable_gqa=gqa)
        else:
            kv = _gather(kv_cache, group.blocks, q.dtype)
            res = F.scaled_dot_product_attention(qs, kv[0], kv[1], attn_mask=group.mask,
                                                 scale=scale, enable_gqa=gqa)
        out[lo:hi] = res[0].transpose(0, 1)
        return
    assert group.token_index is not None and group.valid_rows is not None
    assert group.out_index is not None and group.blocks is not None
    p, max_q = group.num_seqs, group.max_q
    qp = q.index_select(0, group.token_index).view(p, max_q, q.shape[1], q.shape[2])
    kv = _gather(kv_cache, group.blocks, q.dtype)
    res = F.scaled_dot_product_attention(qp.transpose(1, 2), kv[0], kv[1], attn_mask=group.mask,
                                         scale=scale, enable_gqa=gqa)
    res = res.transpose(1, 2).reshape(p * max_q, q.shape[1], q.shape[2])
    out.index_copy_(0, group.out_index, res.index_select(0, group.valid_rows))

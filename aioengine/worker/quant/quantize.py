"""Float weights -> GGUF blocks (numpy), for quantizing Hugging Face weights at load.

Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 follow ggml's reference quantizers (round-to-nearest, the same
bytes as ``gguf.quants.quantize``). Q2_K to Q6_K use a plain min/max (or absmax) fit per sub-block
(ggml's ``quantize_row_q4_K_ref`` searches scales iteratively; ours is simpler and a little less
accurate, the layout is the same, so the kernels and any GGUF reader take it unchanged).
Rows are quantized in chunks to bound the scratch.
"""

from __future__ import annotations

import numpy as np

from aioengine.worker.quant.kernel import QType, qtype_of

_CHUNK_ROWS = 4096


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).view(np.uint8).reshape(*a.shape, 2)


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf (halves away from zero), as ggml rounds; numpy rounds halves to even."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _q8_0(x: np.ndarray) -> np.ndarray:  # x [n, nb, 32]
    amax = np.abs(x).max(axis=-1, keepdims=True)
    d = amax / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d > 0, 1.0 / d, 0.0)
    q = _roundf(x * inv).astype(np.int8)
    return np.concatenate([_f16(d[..., 0]), q.view(np.uint8)], axis=-1)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:  # q [.., 32] in 0..15
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def _symmetric(x: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's Q4_0 / Q5_0 rounding: d = (the value of largest magnitude) / -half, stored
    values trunc(x/d + half + 0.5) clipped to 0..2*half-1; returns (d [.., 1], values)."""
    idx = np.abs(x).argmax(axis=-1)[..., None]
    d = np.take_along_axis(x, idx, axis=-1) / -float(half)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, 1.0 / d, 0.0)
    return d, np.clip(np.trunc(x * inv + (half + 0.5)), 0, 2 * half - 1).astype(np.uint32)


def _q4_0(x: np.ndarray) -> np.ndarray:
    d, q = _symmetric(x, 8)
    return np.concatenate([_f16(d[..., 0]), _pack_nibbles(q.astype(np.uint8))], axis=-1)


def _asymmetric(x: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's Q4_1 / Q5_1 rounding: d = (max - min) / top, m = min, stored values
    trunc((x - m)/d + 0.5) clipped to 0..top; returns (d [.., 1], m [.., 1], values)."""
    lo = x.min(axis=-1, keepdims=True)
    hi = x.max(axis=-1, keepdims=True)
    d = (hi - lo) / float(top)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, 1.0 / d, 0.0)
    return d, lo, np.clip(np.trunc((x - lo) * inv + 0.5), 0, top).astype(np.uint32)


def _q4_1(x: np.ndarray) -> np.ndarray:
    d, lo, q = _asymmetric(x, 15)
    return np.concatenate([_f16(d[..., 0]), _f16(lo[..., 0]), _pack_nibbles(q.astype(np.uint8))],
                          axis=-1)


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1's u32 qh of values q [.., 32] (bit j: the fifth bit of value j), as 4 bytes."""
    qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=-1, dtype=np.uint32)
    return qh[..., None].astype("<u4").view(np.uint8)


def _q5_0(x: np.ndarray) -> np.ndarray:
    d, q = _symmetric(x, 16)
    return np.concatenate([_f16(d[..., 0]), _fifth_bits(q),
                           _pack_nibbles((q & 0xF).astype(np.uint8))], axis=-1)


def _q5_1(x: np.ndarray) -> np.ndarray:
    d, lo, q = _asymmetric(x, 31)
    return np.concatenate([_f16(d[..., 0]), _f16(lo[..., 0]), _fifth_bits(q),
                           _pack_nibbles((q & 0xF).astype(np.uint8))], axis=-1)


def _k_fit(x: np.ndarray, top: int, n_sub: int, smax: int) -> tuple[np.ndarray, ...]:
    """A min/max fit of x [n, nb, 256] in n_sub sub-blocks: per sub-block a scale and a min
    0..smax under the fp16 d and dmin, values 0..top; returns (d, dmin [n, nb, 1], scales,
    mins [n, nb, n_sub], values [n, nb, n_sub, 256 / n_sub])."""
    sub = x.reshape(*x.shape[:-1], n_sub, 256 // n_sub)
    lo = np.minimum(sub.min(axis=-1), 0.0)
    hi = sub.max(axis=-1)
    scale = (hi - lo) / float(top)
    mins = -lo
    d = scale.max(axis=-1, keepdims=True) / float(smax)
    dmin = mins.max(axis=-1, keepdims=True) / float(smax)
    d = d.astype(np.float16).astype(np.float64)
    dmin = dmin.astype(np.float16).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.clip(np.round(scale / d), 0, smax), 0).astype(np.int64)
        mn = np.where(dmin > 0, np.clip(np.round(mins / dmin), 0, smax), 0).astype(np.int64)
        step = d * sc
        offs = dmin * mn
        q = np.where(step[..., None] > 0,
                     np.round((sub + offs[..., None]) / step[..., None]), 0)
    return d, dmin, sc, mn, np.clip(q, 0, top).astype(np.uint8)


def _k_min_fit(x: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                  np.ndarray]:
    """Q4_K's / Q5_K's fit of x [n, nb, 256]: per 32-value sub-block a 6-bit scale and min
    under the fp16 d and dmin, values 0..top; returns (d, dmin [n, nb, 1], the 12 packed scale
    bytes, values [n, nb, 8, 32])."""
    d, dmin, sc, mn, q = _k_fit(x, top, 8, 63)
    scales = np.zeros((*x.shape[:-1], 12), dtype=np.uint8)
    for j in range(4):
        scales[..., j] = sc[..., j] | ((sc[..., j + 4] >> 4) << 6)
        scales[..., j + 4] = mn[..., j] | ((mn[..., j + 4] >> 4) << 6)
        scales[..., j + 8] = (sc[..., j + 4] & 0xF) | ((mn[..., j + 4] & 0xF) << 4)
    return d, dmin, scales, q


def _k_sym_fit(x: np.ndarray, scale: np.ndarray, smax: int, qlo: int,
               qhi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K's / Q3_K's fit of x [n, nb, 256] given a float scale per 16 values [n, nb, 16]:
    int scales -smax-1..smax under the fp16 d, values qlo..qhi; returns (d [n, nb, 1], scales
    [n, nb, 16], values [n, nb, 16, 16])."""
    sub = x.reshape(*x.shape[:-1], 16, 16)
    d = (np.abs(scale).max(axis=-1, keepdims=True) / float(smax)).astype(np.float16)
    d = d.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.clip(np.round(scale / d), -smax - 1, smax), 0).astype(np.int64)
        step = d * sc
        q = np.where(step[..., None] != 0, np.round(sub / step[..., None]), 0)
    return d, sc, np.clip(q, qlo, qhi).astype(np.int64)


def _k_lows(q: np.ndarray) -> np.ndarray:
    """The 64 bytes qs of Q2_K / Q3_K values q [n, nb, 256]: value 128h + 32j + l in bits 2j of
    byte 32h + l."""
    q = (q.astype(np.uint8) & 3).reshape(*q.shape[:-1], 2, 4, 32)
    qs = q[..., 0, :] | (q[..., 1, :] << 2) | (q[..., 2, :] << 4) | (q[..., 3, :] << 6)
    return qs.reshape(*q.shape[:-3], 64)


def _q2_k(x: np.ndarray) -> np.ndarray:  # x [n, nb, 256]
    d, dmin, sc, mn, q = _k_fit(x, 3, 16, 15)
    scales = (sc | (mn << 4)).astype(np.uint8)
    return np.concatenate([scales, _k_lows(q.reshape(*x.shape)), _f16(d[..., 0]),
                           _f16(dmin[..., 0])], axis=-1)


def _q3_k(x: np.ndarray) -> np.ndarray:  # x [n, nb, 256]
    # the value of largest magnitude maps to -4 (the signed scale reaches the range's long end)
    sub = x.reshape(*x.shape[:-1], 16, 16)
    big = np.take_along_axis(sub, np.abs(sub).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    d, sc, q = _k_sym_fit(x, -big / 4.0, 31, -4, 3)
    q = (q + 4).reshape(*x.shape)
    hmask = ((q >> 2).reshape(*x.shape[:-1], 8, 32).astype(np.uint8)
             << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=-2, dtype=np.uint8)
    u = (sc + 32).astype(np.uint8)
    scales = np.concatenate([(u[..., :8] & 0xF) | ((u[..., 8:] & 0xF) << 4),
                             (u[..., 0:4] >> 4) | ((u[..., 4:8] >> 4) << 2)
                             | ((u[..., 8:12] >> 4) << 4) | ((u[..., 12:16] >> 4) << 6)],
                            axis=-1)
    return np.concatenate([hmask, _k_lows(q), scales, _f16(d[..., 0])], axis=-1)


def _k_nibbles(q: np.ndarray) -> np.ndarray:
    """The 128 bytes qs of values q [n, nb, 8, 32]: sub-blocks 2p, 2p+1 the low and high
    nibbles of bytes 32p..32p+31."""
    pairs = (q & 0xF).reshape(*q.shape[:-2], 4, 2, 32)
    return (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).reshape(*q.shape[:-2], 128)


def _q4_k(x: np.ndarray) -> np.ndarray:  # x [n, nb, 256]
    d, dmin, scales, q = _k_min_fit(x, 15)
    return np.concatenate([_f16(d[..., 0]), _f16(dmin[..., 0]), scales,
                           _k_nibbles(q).astype(np.uint8)], axis=-1)


def _q5_k(x: np.ndarray) -> np.ndarray:  # x [n, nb, 256]
    d, dmin, scales, q = _k_min_fit(x, 31)
    # qh[l]: bit s is the fifth bit of value l of sub-block s
    qh = ((q >> 4).astype(np.uint8) << np.arange(8, dtype=np.uint8)[:, None]).sum(
        axis=-2, dtype=np.uint8)
    return np.concatenate([_f16(d[..., 0]), _f16(dmin[..., 0]), scales, qh,
                           _k_nibbles(q).astype(np.uint8)], axis=-1)


def _q6_k(x: np.ndarray) -> np.ndarray:  # x [n, nb, 256]
    amax = np.abs(x.reshape(*x.shape[:-1], 16, 16)).max(axis=-1)
    d, sc, q = _k_sym_fit(x, amax / 31.0, 127, -32, 31)
    q = (q + 32).astype(np.uint8).reshape(*x.shape[:-1], 2, 4, 32)
    # value index within a 128-half: v = 32*g + l, g in 0..3
    ql = np.empty((*x.shape[:-1], 2, 64), dtype=np.uint8)
    ql[..., :32] = (q[..., 0, :] & 0xF) | ((q[..., 2, :] & 0xF) << 4)
    ql[..., 32:] = (q[..., 1, :] & 0xF) | ((q[..., 3, :] & 0xF) << 4)
    qh = ((q[..., 0, :] >> 4) | ((q[..., 1, :] >> 4) << 2) | ((q[..., 2, :] >> 4) << 4)
          | ((q[..., 3, :] >> 4) << 6)).astype(np.uint8)
    return np.concatenate([ql.reshape(*x.shape[:-1], 128), qh.reshape(*x.shape[:-1], 64),
                           sc.astype(np.int8).view(np.uint8), _f16(d[..., 0])], axis=-1)


# ggml's reference quantizers compute in float32: so do ours for those types (bytes equal)
_PRECISION = {"q8_0": np.float32, "q4_0": np.float32, "q4_1": np.float32, "q5_0": np.float32,
              "q5_1": np.float32}
_QUANTIZERS = {"q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1,
               "q2_k": _q2_k, "q3_k": _q3_k, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k}


def quantize(values: np.ndarray, qtype: str | QType | object) -> np.ndarray:
    """``values`` ``[N, K]`` (float) -> ``[N, bytes_per_row]`` uint8 blocks of ``qtype``
    (ValueError naming the problem when K is not whole blocks or the type is unknown)."""
    qt = qtype if isinstance(qtype, QType) else qtype_of(qtype)
    values = np.asarray(values)
    if values.ndim != 2:
        raise ValueError(f"quantize takes a 2-D [N, K] array, got shape {values.shape}")
    n, k = values.shape
    row_bytes = qt.row_bytes(k)
    if not np.isfinite(values).all():
        raise ValueError("cannot quantize weights holding NaN or infinity")
    out = np.empty((n, row_bytes), dtype=np.uint8)
    fn = _QUANTIZERS[qt.name]
    for r in range(0, n, _CHUNK_ROWS):
        chunk = values[r:r + _CHUNK_ROWS].astype(_PRECISION.get(qt.name, np.float64))
        chunk = chunk.reshape(-1, k // qt.block, qt.block)
        out[r:r + _CHUNK_ROWS] = fn(chunk).reshape(-1, row_bytes)
    return out


WIDENED = {"q5_0": "q8_0"}
"""Block types that have a lossless wider twin: a Q5_0 block (fp16 d, 32 high bits, 16 bytes
of nibbles; x = d*(q - 16), q in 0..31) is a Q8_0 block with the same d and int8 values q - 16
(34 bytes for 22, the same numbers). llama.cpp writes Q5_0 where a Q4_K_M file's rows are not
whole 256-value blocks (SmolLM2: every 576-wide linear). The decode path keeps Q5_0 as stored
(the x8 layout); a weight widens it where it runs the row layout (no fast Q5_0 row kernels) or
where the policy asks for Q8_0."""


def q5_0_as_q8_0(raw: np.ndarray) -> np.ndarray:
    """Q5_0 rows (uint8 ``[n, nb*22]``) -> the Q8_0 rows of the same values (``[n, nb*34]``)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] % 22:
        raise ValueError(f"Q5_0 rows are whole 22-byte blocks, got uint8 {raw.shape}")
    n, nb = raw.shape[0], raw.shape[1] // 22
    b = raw.reshape(n, nb, 22)
    qh = b[..., 2:6].copy().view("<u4")[..., 0]  # [n, nb]
    hi = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    qs = b[..., 6:]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # values 0..15, then 16..31
    out = np.empty((n, nb, 34), dtype=np.uint8)
    out[..., :2] = b[..., :2]
    out[..., 2:] = ((low | hi).astype(np.int16) - 16).astype(np.int8).view(np.uint8)
    return out.reshape(n, nb * 34)

"""A linear layer's weight kept quantized: output-row segments, each computed by one kernel call
into its slice of the output.

A fused projection (q/k/v, gate/up) is loaded part by part; each part becomes a segment of its
own block type (Q4_K_M files mix Q4_K and Q6_K), and adjacent segments of one type are joined
so a uniform layer still makes one call. A segment may also hold float rows (a GGUF tensor in a
type the kernels do not compute, kept dequantized).

``QuantPolicy.mode``: ``"gguf"`` keeps a GGUF file's blocks as stored (tensors of other types are
dequantized to float); a type name (``"q8_0"``, ``"q4_k"``, ...) quantizes float weights at load
to that type, and takes GGUF blocks already of that type unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from aioengine.worker.parallel.weights import source_shape
from aioengine.worker.quant.kernel import (
    ACTIVATIONS,
    QTYPES,
    X8_TYPES,
    QkSeg,
    QType,
    QuantKernel,
    QuantKernelError,
    error_text,
    load_quant_kernel,
)
from aioengine.worker.quant.quantize import WIDENED, q5_0_as_q8_0, quantize
from aioengine.worker.threads import kernel_threads

logger = logging.getLogger(__name__)

_layout_epoch = 0


def layout_epoch() -> int:
    """A count that moves whenever any ``QuantizedWeight``'s decode plan or policy changes in
    this process: the decode plan (which holds their pointers) checks its weights one by one
    only when it moved (a check per weight, every step, was a visible share of a batch-1
    step; docs/benchmarks.md)."""
    return _layout_epoch


def _layout_changed() -> None:
    global _layout_epoch
    _layout_epoch += 1

QUANTIZATION_MODES = ("gguf", *QTYPES)
"""Values of ``EngineConfig.quantization`` (besides None: float weights)."""

# M at or above which a call dequantizes the segment into a float32 scratch and runs torch's
# sgemm on it (prefill); below, the kernel's own paths: the dequantization pays off only once
# enough rows share it. Measured with scripts/bench_quant_gemv.py --small-m (docs/quantization.md,
# docs/benchmarks.md): with int16 activations the kernel is faster up to M=8 and even at 16.
SGEMM_MIN_ROWS = 16
_INT8_TYPES = ("q8_0", "q4_0", "q4_1")


@dataclass(frozen=True)
class QuantPolicy:
    mode: str
    """``gguf`` or a block type name (see the module docstring)."""
    activations: str = "int16"
    """``float32``, ``int16`` or ``int8`` (``kernel.ACTIVATIONS``); int8 applies to
    q8_0/q4_0/q4_1 segments (other types use int16)."""
    sgemm_min_rows: int = SGEMM_MIN_ROWS
    x8: bool = True
    """Keep weights of the x8 types (``kernel.X8_TYPES``) in the interleaved x8 layout (8 rows'
    blocks side by side, made on first use) when the activations are int16: the GEMV's fast
    path. False: the file's row layout (A/B comparisons; ``CpuKernelConfig.quant_x8``)."""
    x8_prefill: bool = True
    """x8 weights compute every M (prefill too) with the x8 kernels; False: from
    ``sgemm_min_rows`` rows on, a dequantized copy and torch's sgemm (A/B;
    ``CpuKernelConfig.quant_x8_prefill``)."""

    def __post_init__(self) -> None:
        if self.mode not in QUANTIZATION_MODES:
            raise ValueError(f"quantization must be one of {QUANTIZATION_MODES} (or None), got "
                             f"{self.mode!r}")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"quantized activations must be one of {tuple(ACTIVATIONS)}, got "
                             f"{self.activations!r}")

    @property
    def qtype(self) -> QType | None:
        return QTYPES.get(self.mode)


@dataclass
class Segment:
    """Output rows ``[offset, offset + n)``: ``qtype`` blocks (uint8 ``[n, row_bytes]``, or the
    1-D x8 layout when ``x8``) or float32 rows ``[n, K]`` when ``qtype`` is None."""

    offset: int
    n: int
    qtype: QType | None
    data: torch.Tensor
    x8: bool = False


def _source_qtype(src: Any, want: QType | None = None) -> QType | None:
    """The kernels' type for a source's stored blocks, or None (float or unsupported); the
    type they widen to (``quantize.WIDENED``: Q5_0 -> Q8_0) when ``want`` is that type."""
    name = getattr(getattr(src, "qtype", None), "name", None)
    if not isinstance(name, str):
        return None
    name = name.lower()
    if want is not None and WIDENED.get(name) == want.name:
        return want
    return QTYPES.get(name)


def _raw(src: Any, start: int, length: int, qtype: QType) -> np.ndarray:
    """Stored blocks of rows ``[start, start+length)`` as ``qtype`` (widened where the file's
    type is another, see ``_source_qtype``)."""
    raw = np.asarray(src.raw_rows(start, length))
    name = getattr(getattr(src, "qtype", None), "name", "")
    if isinstance(name, str) and name.lower() == "q5_0" and qtype.name == "q8_0":
        return q5_0_as_q8_0(raw)
    return raw


def _kept(src: Any, stored: QType | None, data: torch.Tensor,
          values: torch.Tensor | None = None) -> tuple[QType | None, torch.Tensor]:
    """``(stored, data)``, noted on a source that records what layers keep of it (a GGUF
    tensor, for the start-up log: loader/gguf_report.py) under its path: the file's blocks,
    blocks widened to another type, ``values`` quantized at load, or float32 rows."""
    note = getattr(src, "note_kept", None)
    if note is not None:
        if values is not None:
            path = f"{stored.name} (quantized at load)" if stored is not None else "float32"
        else:
            assert stored is not None
            name = getattr(getattr(src, "qtype", None), "name", "")
            path = (f"packed {stored.name}" if str(name).lower() == stored.name
                    else f"{stored.name} (widened)")
        note(path, data.numel() * data.element_size(),
             0 if values is None else values.numel() * 4)
    return stored, data


def source_rows(src: Any, start: int, length: int, policy: QuantPolicy) -> tuple[QType | None,
                                                                                  torch.Tensor]:
    """Rows ``[start, start+length)`` of a checkpoint source in the form ``policy`` keeps:
    the stored blocks when the source has them in a type the policy takes, else float rows,
    quantized to the policy's type when it names one."""
    want = policy.qtype
    stored = _source_qtype(src, want)
    if stored is not None and hasattr(src, "raw_rows") and (want is None or stored == want):
        raw = np.ascontiguousarray(_raw(src, start, length, stored))
        return _kept(src, stored, torch.from_numpy(raw.copy() if not raw.flags.writeable
                                                   else raw))
    values = src[start:start + length]
    values = values.float() if isinstance(values, torch.Tensor) else torch.as_tensor(values)
    if want is None or not _whole_blocks(values.shape[1], want):
        return _kept(src, None, values.contiguous(), values)
    return _kept(src, want, torch.from_numpy(quantize(values.numpy(), want)), values)


def _whole_blocks(k: int, qtype: QType) -> bool:
    """Rows of ``k`` values quantize to ``qtype`` only as whole blocks; a weight whose rows do
    not (e.g. an intermediate size of 688 for 32-value blocks) stays float32."""
    if k % qtype.block:
        logger.info("rows of %d values are not whole %s blocks of %d: kept in float32", k,
                    qtype.name, qtype.block)
        return False
    return True


def source_cols(src: Any, start: int, length: int, policy: QuantPolicy) -> tuple[QType | None,
                                                                                  torch.Tensor]:
    """Columns ``[start, start+length)`` of every row, as ``source_rows``; stored blocks are cut
    at block boundaries (ValueError naming the sizes otherwise)."""
    want = policy.qtype
    stored = _source_qtype(src, want)
    n, k = source_shape(src)
    if stored is not None and hasattr(src, "raw_rows") and (want is None or stored == want):
        if start % stored.block or length % stored.block:
            raise ValueError(f"cannot split {stored.name} rows of {k} values at columns "
                             f"[{start}, {start + length}): the split must fall on "
                             f"{stored.block}-value block boundaries (use fewer tensor-parallel "
                             f"ranks or another quantization)")
        raw = _raw(src, 0, n, stored)
        b0 = start // stored.block * stored.bytes
        b1 = (start + length) // stored.block * stored.bytes
        return _kept(src, stored, torch.from_numpy(np.ascontiguousarray(raw[:, b0:b1]).copy()))
    values = src[:, start:start + length]
    values = values.float() if isinstance(values, torch.Tensor) else torch.as_tensor(values)
    if want is None or not _whole_blocks(length, want):
        return _kept(src, None, values.contiguous(), values)
    return _kept(src, want, torch.from_numpy(quantize(values.contiguous().numpy(), want)),
                 values)


@dataclass
class _Plan:
    policy: QuantPolicy
    segs: Any  # ctypes array of QkSeg
    nseg: int
    keep: tuple[torch.Tensor, ...]
    any_m: bool = False
    """Every segment is x8 on a SIMD path: the plan takes any M (prefill too)."""


class QuantizedWeight:
    """``forward(x[..., K]) -> [..., N]``: the weight as segments of output rows."""

    def __init__(self, out_features: int, in_features: int, policy: QuantPolicy,
                 kernel: QuantKernel | None = None) -> None:
        self._plan_now: _Plan | None = None
        self.out_features = out_features
        self.in_features = in_features
        self.policy = policy
        self.kernel = kernel if kernel is not None else load_quant_kernel()
        self._parts: dict[int, Segment] = {}
        self._joined: list[Segment] | None = None
        self._plan: _Plan | None = None

    @property
    def policy(self) -> QuantPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: QuantPolicy) -> None:
        self._policy = policy
        _layout_changed()

    @property
    def _plan(self) -> _Plan | None:
        return self._plan_now

    @_plan.setter
    def _plan(self, plan: _Plan | None) -> None:
        if plan is not self._plan_now:
            self._plan_now = plan
            _layout_changed()

    def set_rows(self, offset: int, qtype: QType | None, data: torch.Tensor) -> None:
        """Output rows from ``offset``: blocks of ``qtype`` (uint8) or float rows (None)."""
        n = data.shape[0]
        if offset < 0 or offset + n > self.out_features:
            raise ValueError(f"rows [{offset}, {offset + n}) fall outside the "
                             f"{self.out_features} output rows")
        if qtype is None:
            if tuple(data.shape) != (n, self.in_features):
                raise ValueError(f"float rows must be [{n}, {self.in_features}], got "
                                 f"{tuple(data.shape)}")
            data = data.to(torch.float32).contiguous()
        elif data.dtype != torch.uint8 or tuple(data.shape) != (n, qtype.row_bytes(
                self.in_features)):
            raise ValueError(f"{qtype.name} rows of {self.in_features} values must be uint8 "
                             f"[{n}, {qtype.row_bytes(self.in_features)}], got {data.dtype} "
                             f"{tuple(data.shape)}")
        self._parts[offset] = Segment(offset, n, qtype, data.contiguous())
        self._joined = None
        self._plan = None

    @property
    def segments(self) -> list[Segment]:
        """The loaded rows, adjacent runs of one type joined (checked to cover every row)."""
        if self._joined is None:
            parts = [self._parts[o] for o in sorted(self._parts)]
            end = 0
            for p in parts:
                if p.offset != end:
                    raise RuntimeError(f"quantized weight rows [{end}, {p.offset}) were never "
                                       "loaded")
                end = p.offset + p.n
            if end != self.out_features:
                raise RuntimeError(f"quantized weight rows [{end}, {self.out_features}) were "
                                   "never loaded")
            joined: list[Segment] = []
            for p in parts:
                self._rows(p)
                last = joined[-1] if joined else None
                if last is not None and last.qtype == p.qtype:
                    joined[-1] = Segment(last.offset, last.n + p.n, p.qtype,
                                         torch.cat([last.data, p.data]))
                else:
                    joined.append(p)
            self._parts = {s.offset: s for s in joined}
            self._joined = joined
        return self._joined

    def _rows(self, s: Segment) -> None:
        """``s`` in the row layout (from x8 if it was repacked)."""
        if s.x8:
            s.data = self.kernel.unpack_x8(s.qtype, s.data, s.n, self.in_features)
            s.x8 = False
            self._plan = None

    def _layout(self, s: Segment, act: str) -> bool:
        """Put ``s`` in the layout the kernels take for activations ``act``; True: x8."""
        want = self._x8_path(s, act)
        if not want and s.qtype.name in WIDENED:
            # Q5_0 rows have scalar kernels only: outside x8 they run as the Q8_0 blocks of the
            # same values (34 bytes for 22, the AVX2/AVX-512 row paths)
            self._rows(s)
            wide = QTYPES[WIDENED[s.qtype.name]]
            s.data = torch.from_numpy(q5_0_as_q8_0(s.data.numpy()))
            s.qtype = wide
            self._plan = None
        if want and not s.x8:
            s.data = self.kernel.repack_x8(s.qtype, s.data, self.in_features)
            s.x8 = True
            self._plan = None
        elif not want:
            self._rows(s)
        return want

    def prepare(self) -> None:
        """Lay every quantized segment out as the policy's forward takes it (done on first use
        otherwise)."""
        for s in self.segments:
            if s.qtype is not None:
                self._layout(s, self._activations(s))
        self._make_plan()

    def _make_plan(self) -> None:
        """The decode fast path's one C call over every segment, once every segment is laid
        out for the current policy (none when a segment holds float rows)."""
        segs = self.segments
        if any(s.qtype is None for s in segs):
            self._plan = None
            return
        arr = (QkSeg * len(segs))()
        for a, s in zip(arr, segs, strict=True):
            a.t, a.x8 = s.qtype.ggml_id, int(s.x8)
            a.act = ACTIVATIONS[self._activations(s)]
            a.w, a.row_bytes = s.data.data_ptr(), 0 if s.x8 else s.data.shape[1]
            a.n, a.offset = s.n, s.offset
        # the tensors stay referenced by the plan: its pointers are theirs
        self._plan = _Plan(self.policy, arr, len(segs), tuple(s.data for s in segs),
                           all(s.x8 for s in segs) and self._x8_any_m())

    def _x8_any_m(self) -> bool:
        """x8 segments take every M (prefill included) through the x8 kernels rather than a
        dequantized copy and torch's sgemm: with int16 activations the two-group tile beat
        dequantize + sgemm at M=512 by 1.2-2.3x on SmolLM2's shapes (AVX2 and VNNI, 1 thread,
        scripts/bench_quant_prefill.py); not on the scalar path."""
        return self.policy.x8_prefill and self.kernel.best_level >= 1

    def _x8_path(self, s: Segment, act: str) -> bool:
        return self.policy.x8 and act == "int16" and s.qtype.name in X8_TYPES

    def _activations(self, s: Segment) -> str:
        act = self.policy.activations
        return "int16" if act == "int8" and s.qtype.name not in _INT8_TYPES else act

    @property
    def nbytes(self) -> int:
        return sum(s.data.numel() * s.data.element_size() for s in self.segments)

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[N, K]`` weight (tests, debugging)."""
        out = torch.empty(self.out_features, self.in_features)
        for s in self.segments:
            if s.qtype is None:
                out[s.offset:s.offset + s.n] = s.data
            else:
                self._dequantize(s, out[s.offset:s.offset + s.n], torch.get_num_threads())
        return out

    def _dequantize(self, s: Segment, out: torch.Tensor | None, threads: int) -> torch.Tensor:
        if s.x8:
            return self.kernel.dequantize_x8(s.qtype, s.data, s.n, self.in_features, out,
                                             threads=threads)
        return self.kernel.dequantize(s.qtype, s.data, self.in_features, out, threads=threads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = self._plan
        # decode fast path: a contiguous float32 [M, K] batch below the sgemm threshold, every
        # segment already laid out for this policy -> one unchecked C call (inputs checked here,
        # the weights at set_rows and when the plan was made)
        if plan is not None and plan.policy is self.policy and x.dtype is torch.float32 \
                and x.dim() == 2 and x.is_cpu and x.is_contiguous():
            m, k = x.shape
            if k == self.in_features and m > 0 and (m < plan.policy.sgemm_min_rows
                                                    or plan.any_m):
                n = self.out_features
                out = torch.empty(m, n)
                code = self.kernel.raw_matmul_segs(plan.segs, plan.nseg, x.data_ptr(), k, m, k,
                                                   out.data_ptr(), n, kernel_threads())
                if code:
                    raise QuantKernelError(f"qk_matmul_segs rejected its inputs: "
                                           f"{error_text(code)} (M={m}, N={n}, K={k})")
                return out
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if x.shape[-1] != self.in_features or x.device.type != "cpu":
            raise QuantKernelError(f"expected CPU activations [..., {self.in_features}], got "
                                   f"{tuple(x.shape)} on {x.device}")
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        x2 = x2.contiguous()
        m = x2.shape[0]
        segs = self.segments
        threads = torch.get_num_threads()
        out = torch.empty(m, self.out_features, dtype=torch.float32, device=x.device)
        laid_out = True  # every quantized segment laid out for this policy (the plan's premise)
        for s in segs:
            dst = out[:, s.offset:s.offset + s.n] if len(segs) > 1 else out
            if s.qtype is None:
                torch.mm(x2, s.data.t(), out=dst) if len(segs) == 1 else dst.copy_(
                    F.linear(x2, s.data))
            elif m >= self.policy.sgemm_min_rows and not (
                    self._x8_any_m() and self._x8_path(s, self._activations(s))):
                laid_out = False
                w = self._dequantize(s, None, threads)
                if len(segs) == 1:
                    torch.mm(x2, w.t(), out=dst)
                else:
                    dst.copy_(F.linear(x2, w))
            else:  # rows checked at set_rows, x2 and out contiguous float32: the bare C call
                threads = kernel_threads()
                act = self._activations(s)
                if self._layout(s, act):
                    code = self.kernel.raw_matmul_x8(
                        s.qtype.ggml_id, x2.data_ptr(), self.in_features, m, s.data.data_ptr(),
                        s.n, self.in_features, out.data_ptr() + 4 * s.offset,
                        self.out_features, threads, -1)
                else:
                    act = self._activations(s)  # a widened Q5_0 segment is Q8_0 now
                    code = self.kernel.raw_matmul(
                        s.qtype.ggml_id, x2.data_ptr(), self.in_features, m,
                        s.data.data_ptr(), s.data.shape[1], s.n, self.in_features,
                        out.data_ptr() + 4 * s.offset, self.out_features, threads, -1,
                        ACTIVATIONS[act])
                if code:
                    raise QuantKernelError(f"qk_matmul rejected its inputs: "
                                           f"{error_text(code)} ({s.qtype.name}, M={m}, "
                                           f"N={s.n}, K={self.in_features})")
        if laid_out and (self._plan is None or self._plan.policy is not self.policy):
            self._make_plan()  # every segment is now laid out for this policy
        return out.reshape(*lead, self.out_features)

    __call__ = forward

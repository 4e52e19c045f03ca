"""Our side of the ``peers`` decode/prefill rows, in a fresh interpreter per measurement
(``python -m aioengine.bench.peers SPEC``): torch is imported here, never in the suite's
process."""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

MARK = "PEERS-RESULTS "
CHILD_TIMEOUT = 900.0


def ours_child(spec: dict, env: dict[str, str] | None = None) -> dict:
    """Run ``measure(spec)`` in a fresh interpreter and return what it printed."""
    from aioengine.bench.peers import procs

    proc = procs.run([sys.executable, "-m", "aioengine.bench.peers", json.dumps(spec)],
                     timeout=CHILD_TIMEOUT, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"peers bench child failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(MARK):])


PAGES = ("huge", "4k")
"""Kinds of memory ``read_bandwidth`` reads: 2 MiB transparent huge pages (``MADV_HUGEPAGE``,
where our weights live: the F32 arena, malloc with ``glibc.malloc.hugetlb=1``) and 4 KiB pages
(``MADV_NOHUGEPAGE``). One thread reads huge pages much faster (docs/benchmarks.md): the
prefetcher stops at every 4 KiB page."""
HUGE_PAGE = 2 << 20


def page_buffer(nbytes: int, pages: str) -> Any:
    """A float32 tensor of ``nbytes`` filled with ones on an anonymous mapping of that kind of
    pages (2 MiB aligned); ValueError for another kind."""
    import mmap

    import torch

    if pages not in PAGES:
        raise ValueError(f"pages must be one of {', '.join(PAGES)}, got {pages!r}")
    mm = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm.madvise(mmap.MADV_HUGEPAGE if pages == "huge" else mmap.MADV_NOHUGEPAGE)
    raw = torch.frombuffer(mm, dtype=torch.uint8)  # keeps the mapping alive with its views
    off = (-raw.data_ptr()) % HUGE_PAGE
    buf = raw[off:off + nbytes].view(torch.float32)
    buf.fill_(1.0)  # the pages are faulted in here, as what was advised
    return buf


def huge_page_fraction(tensors: list[Any]) -> float:
    """Of these tensors' bytes, the share on transparent huge pages: each tensor counts with
    the ``AnonHugePages / Rss`` of the mapping holding it (``/proc/self/smaps``; 0 off Linux)."""
    try:
        with open("/proc/self/smaps") as f:
            text = f.read()
    except OSError:
        return 0.0
    maps: list[tuple[int, int, dict[str, int]]] = []
    for line in text.splitlines():
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            maps.append((lo, hi, {}))
        elif maps and head in ("Rss:", "AnonHugePages:"):
            maps[-1][2][head] = int(line.split()[1])
    total = huge = 0.0
    for t in tensors:
        ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
        for lo, hi, kb in maps:
            if lo <= ptr < hi:
                total += nbytes
                huge += nbytes * min(1.0, kb.get("AnonHugePages:", 0) / max(1, kb.get("Rss:", 0)))
                break
    return huge / total if total else 0.0


def read_bandwidth(mib: int = 256, threads: int = 1, pages: str = "huge",
                   reps: int = 5) -> tuple[float, float]:
    """(GB/s of one streaming pass over ``mib`` MiB of float32 on ``pages`` at ``threads``,
    median of ``reps``; the share of the buffer the kernel did put on huge pages). The pass is
    the float32 GEMV kernel's (a dot product per 16 KiB row: two flops per 4 bytes, far below
    what the cores can do, so it runs at the read limit). torch's ``sum`` is not a bandwidth
    test: it reached half of that."""
    import torch

    from aioengine.worker import gemv

    kernel = gemv.GemvKernel(str(gemv.ensure_built()))
    k = 4096
    w = page_buffer(mib * 1024 * 1024, pages).view(-1, k)
    x = torch.ones(1, k)
    kernel(x, w, threads=threads)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        kernel(x, w, threads=threads)
        times.append(time.perf_counter() - t0)
    return w.numel() * 4 / statistics.median(times) / 1e9, huge_page_fraction([w])


def measure(spec: dict) -> dict:
    """Batch-1 decode and one prefill of ``spec["model"]`` at ``spec["threads"]`` (None: the
    engine's own default, as ``python -m aioengine.serve`` picks it), the weight bytes a decode
    step reads, the threads the engine's linears ran on, how the weights are laid out, and the
    machine's read bandwidth right after. ``spec["x8"]`` False: quantized weights in the file's
    row layout (``CpuKernelConfig.quant_x8``)."""
    import torch

    from aioengine.bench.kernels import _OurModel
    from aioengine.config import CpuKernelConfig, EngineConfig
    from aioengine.worker.model_runner import ModelRunner

    block, steps = 16, spec["decode_tokens"]
    longest = max(spec["prefill_len"], 256 + steps + 8)
    per_seq = -(-longest // block)
    config = EngineConfig(model=spec["model"], block_size=block, num_kv_blocks=per_seq,
                          max_num_seqs=1, num_threads=spec["threads"], dtype="float32",
                          quantization=spec.get("quantization"),
                          cpu_kernels=CpuKernelConfig(quant_x8=spec.get("x8", True)))
    runner = ModelRunner(config)
    runner.allocate_kv_cache(per_seq)
    ours = _OurModel(runner, per_seq)
    vocab = runner.spec.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, 256), generator=g).tolist()
    ms = ours.decode_ms(prompt, 5, steps)
    got: dict[str, Any] = {"decode_tok_s": 1000 / ms, **linear_threads(runner),
                           **weight_layout(runner.model)}
    if not spec.get("decode_only"):
        pre = torch.randint(0, vocab, (1, spec["prefill_len"]), generator=g).tolist()
        got["prefill_tok_s"] = ours.prefill_tokens_per_s(pre, 2)
        for pages in PAGES:  # at the decode's thread count, right after it
            gbs, huge = read_bandwidth(256, got["threads"], pages)
            got[f"read_gbytes_per_s_{pages}"], got[f"read_huge_fraction_{pages}"] = gbs, huge
    got["weight_bytes"] = decode_read_bytes(runner.model)
    got["weights_huge_fraction"] = huge_page_fraction(decode_tensors(runner.model))
    return got


def _quantized_weights(model: Any) -> list[Any]:
    out = []
    for module in model.modules():
        for attr in ("qweight", "qhead"):
            quantized = getattr(module, attr, None)
            if quantized is not None:
                out.append(quantized)
    return out


def linear_threads(runner: Any) -> dict[str, int]:
    """The threads the engine's decode linears run on: the compiled kernels' count for
    quantized weights, the GEMV pool's for float32 ones (both picked by measurement at load
    when ``num_threads`` is unset, ``worker.threads.cached_fastest_count``), else torch's."""
    import torch

    from aioengine.worker import gemv
    from aioengine.worker.threads import kernel_threads

    if _quantized_weights(runner.model):
        threads = kernel_threads()
    else:
        threads = gemv.threads() if runner.uses_gemv_kernel else torch.get_num_threads()
    return {"threads": threads, "torch_threads": torch.get_num_threads(),
            "gemv_threads": gemv.threads(), "kernel_threads": kernel_threads(),
            "threads_measured": int(runner.kernel_threads_measured)}


def weight_layout(model: Any) -> dict[str, float]:
    """Fractions of the quantized weights' bytes in the interleaved x8 layout and kept as float
    rows (a tensor type without a kernel, or rows that are not whole blocks)."""
    total = x8 = flt = 0
    for w in _quantized_weights(model):
        for s in w.segments:
            total += s.data.nbytes
            x8 += s.data.nbytes if s.x8 else 0
            flt += s.data.nbytes if s.qtype is None else 0
    return {"x8_fraction": x8 / total if total else 0.0,
            "float_fraction": flt / total if total else 0.0}


def decode_tensors(model: Any) -> list[Any]:
    """The weight tensors a batch-1 decode step reads (``decode_read_bytes``' set; the float
    input embedding table too, which is looked up)."""
    out = [p for module in model.modules() for p in module.parameters(recurse=False)]
    return out + [s.data for w in _quantized_weights(model) for s in w.segments]


def decode_read_bytes(model: Any) -> int:
    """Weight bytes a batch-1 decode step reads: every float parameter and quantized weight,
    less the input embedding table (one row is looked up) unless the float head is that table."""
    total = 0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            total += p.numel() * p.element_size()
    total += sum(q.nbytes for q in _quantized_weights(model))
    embed = model.embed_tokens
    if embed.weight is not None and (model.lm_head is not None or embed.qhead is not None):
        total -= embed.weight.numel() * embed.weight.element_size()
    return total

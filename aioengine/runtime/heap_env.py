"""The environment a model process is started with, for what glibc reads before Python runs.

Batch-1 decode streams every weight once per token. On 4 KiB pages the hardware prefetcher
stops at every page: on the 2-core EPYC one thread reads 4 KiB-paged memory at 18-21 GB/s and
huge-paged memory at 33-35 GB/s (docs/benchmarks.md). The float32 weights are moved into a
huge-page arena after load (``gemv.huge_page_weights``); quantized weights, their x8 copies and
the KV cache are many allocations of torch's, so instead glibc's malloc is asked to back its
heap and large blocks with transparent huge pages (``glibc.malloc.hugetlb=1``, glibc >= 2.35;
older glibc ignores the tunable). SmolLM2 Q4_1 batch-1 step: 8.46 -> 6.73-7.03 ms at one
thread, 6.51 -> 5.68-6.14 ms at two (scripts/bench_quant_decode.py, fresh interpreters
alternated). ``AIOENGINE_HUGE_PAGES=0`` turns both off.
"""

from __future__ import annotations

import os
import sys

HUGE_PAGES_ENV = "AIOENGINE_HUGE_PAGES"
TUNABLE = "glibc.malloc.hugetlb"


def model_process_env() -> dict[str, str]:
    """Variables to add to an engine or worker process's environment (empty off Linux, with
    ``AIOENGINE_HUGE_PAGES=0``, or where the user set the tunable already)."""
    if not sys.platform.startswith("linux") or os.environ.get(HUGE_PAGES_ENV, "1") == "0":
        return {}
    current = os.environ.get("GLIBC_TUNABLES", "")
    if TUNABLE in current:
        return {}
    return {"GLIBC_TUNABLES": f"{current}:{TUNABLE}=1" if current else f"{TUNABLE}=1"}

"""The environment a model process is started with, for what glibc and torch's OpenMP runtime
read before Python runs.

Batch-1 decode streams every weight once per token. On 4 KiB pages the hardware prefetcher
stops at every page: on the 2-core EPYC one thread reads 4 KiB-paged memory at 18-21 GB/s and
huge-paged memory at 33-35 GB/s (docs/benchmarks.md). The float32 weights are moved into a
huge-page arena after load (``gemv.huge_page_weights``); quantized weights, their x8 copies and
the KV cache are many allocations of torch's, so instead glibc's malloc is asked to back its
heap and large blocks with transparent huge pages (``glibc.malloc.hugetlb=1``, glibc >= 2.35;
older glibc ignores the tunable). SmolLM2 Q4_1 batch-1 step: 8.46 -> 6.73-7.03 ms at one
thread, 6.51 -> 5.68-6.14 ms at two (scripts/bench_quant_decode.py, fresh interpreters
alternated). ``AIOENGINE_HUGE_PAGES=0`` turns both off.

torch's OpenMP workers (GNU libgomp in the CPU wheels) spin after every parallel region before
they sleep (``GOMP_SPINCOUNT``, ~ms): a model process with more than one torch thread (an
explicit ``num_threads``, or any machine of three or more CPUs) that runs a torch op between
decode steps, as the sampler does for every row that is not greedy, had those workers spinning
on the cores the compiled kernels' pool then ran on. SmolLM2 Q4_1 with ``num_threads=2`` on the
2-core EPYC, batch 1, temperature 0.8: the decode plan's call took 14.0 ms against 7.4 after a
greedy step, the step 15.7 ms; with ``OMP_WAIT_POLICY=PASSIVE`` (idle workers sleep at once)
7.8 and 9.1 ms, prefill 512 unchanged within noise. So a model process gets ``PASSIVE`` unless
the user set a policy. A process that imports torch itself (``InprocClient``, a bare
``ModelRunner``) is the user's to start with it.
"""

from __future__ import annotations

import os
import sys

HUGE_PAGES_ENV = "AIOENGINE_HUGE_PAGES"
TUNABLE = "glibc.malloc.hugetlb"
OMP_WAIT_ENV = "OMP_WAIT_POLICY"


def model_process_env() -> dict[str, str]:
    """Variables to add to an engine or worker process's environment: the OpenMP wait policy
    (``PASSIVE``, unless the user set one) and the huge-page heap tunable (not off Linux, with
    ``AIOENGINE_HUGE_PAGES=0``, or where the user set the tunable already)."""
    env = {} if os.environ.get(OMP_WAIT_ENV) else {OMP_WAIT_ENV: "PASSIVE"}
    if not sys.platform.startswith("linux") or os.environ.get(HUGE_PAGES_ENV, "1") == "0":
        return env
    current = os.environ.get("GLIBC_TUNABLES", "")
    if TUNABLE in current:
        return env
    return {**env, "GLIBC_TUNABLES": f"{current}:{TUNABLE}=1" if current else f"{TUNABLE}=1"}

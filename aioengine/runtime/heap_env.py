"""The environment a model process is started with, for what glibc and torch's OpenMP runtime
read before Python runs.

Batch-1 decode streams every weight once per token. On 4 KiB pages the hardware prefetcher stops
at every page, so one thread reads huge-paged memory much faster than 4 KiB-paged memory
(figures: docs/benchmarks.md, "Measurements behind design choices"). The float32 weights are
moved into a huge-page arena after load (``gemv.huge_page_weights``); quantized weights, their
x8 copies and the KV cache are many allocations of torch's, so instead glibc's malloc is asked
to back its heap and large blocks with transparent huge pages (``glibc.malloc.hugetlb=1``, glibc
>= 2.35; older glibc ignores the tunable); a quantized batch-1 step got faster at one and two
threads. ``CpuKernelConfig.huge_pages`` off turns both off (the client that
spawns the model process reads it from the config).

torch's OpenMP workers (GNU libgomp in the CPU wheels) spin after every parallel region before
they sleep (``GOMP_SPINCOUNT``, ~ms): a model process with more than one torch thread (an
explicit ``num_threads``, or any machine of three or more CPUs) that runs a torch op between
decode steps, as the sampler does for every row that is not greedy, had those workers spinning
on the cores the compiled kernels' pool then ran on: the decode plan's call took far longer
after a sampled step than after a greedy one. With ``OMP_WAIT_POLICY=PASSIVE`` (idle workers
sleep at once) it did not, and prefill was unchanged. So a model process gets ``PASSIVE`` unless
the user set a policy. A process that imports torch itself (``InprocClient``, a bare
``ModelRunner``) is the user's to start with it.
"""

from __future__ import annotations

import os
import sys

TUNABLE = "glibc.malloc.hugetlb"
OMP_WAIT_ENV = "OMP_WAIT_POLICY"


def model_process_env(huge_pages: bool = True) -> dict[str, str]:
    """Variables to add to an engine or worker process's environment: the OpenMP wait policy
    (``PASSIVE``, unless the user set one) and the huge-page heap tunable (not off Linux,
    without ``huge_pages`` (``CpuKernelConfig.huge_pages``), or where the user set the tunable
    already)."""
    env = {} if os.environ.get(OMP_WAIT_ENV) else {OMP_WAIT_ENV: "PASSIVE"}
    if not sys.platform.startswith("linux") or not huge_pages:
        return env
    current = os.environ.get("GLIBC_TUNABLES", "")
    if TUNABLE in current:
        return env
    return {**env, "GLIBC_TUNABLES": f"{current}:{TUNABLE}=1" if current else f"{TUNABLE}=1"}

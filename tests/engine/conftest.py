"""Engine test fixtures: one in-process uniproc engine core per module on the tiny model, the
tiny model's facts, and one thread per torch process (a 2-core box shared by many runs)."""

from __future__ import annotations

import os

import pytest

from aioengine.config import EngineConfig

# Small enough that the workload in workload.py preempts, large enough for any one request.
SMALL = dict(model="tiny", device="cpu", block_size=4, num_kv_blocks=40, max_model_len=96,
             max_num_seqs=32, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def one_thread():
    """Torch in this process and in spawned children uses one intra-op thread: oversubscribed
    threads make the tiny model ~15x slower on a loaded 2-core machine."""
    import torch

    before = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)


def small_config(**changes) -> EngineConfig:
    return EngineConfig(**{**SMALL, **changes})


@pytest.fixture(scope="module")
def core(one_thread):
    from aioengine.engine.core import EngineCore

    c = EngineCore(small_config())
    yield c
    c.shutdown()


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))


@pytest.fixture(scope="session")
def vocab_size() -> int:
    from aioengine.hub import read_model_info, resolve_model

    return read_model_info(resolve_model("tiny").model_path).vocab_size


@pytest.fixture(scope="session")
def alone_reference(vocab_size):
    """The workload's greedy outputs with every request run alone (one sequence at a time, no
    prefix cache), in process, on the uniproc executor."""
    import torch

    from aioengine.engine.core import EngineCore

    from .workload import run_core, workload

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    core = EngineCore(small_config(max_num_seqs=1, enable_prefix_caching=False))
    try:
        return run_core(core, workload(vocab_size))
    finally:
        core.shutdown()
        torch.set_num_threads(before)

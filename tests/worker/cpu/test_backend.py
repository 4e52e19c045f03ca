"""The CPU backend (``aioengine.worker.cpu.backend``): the ModelRunner builds it once per loaded
model, and it picks the decode path as ``EngineConfig.cpu_kernels`` says: the model runs the
path it names (the decode plan and lane run, or not), with the same greedy tokens."""

from __future__ import annotations

import logging
import shutil

import pytest

from aioengine.config import CpuKernelConfig, EngineConfig
from aioengine.messages.sampling_params import SamplingParams
from aioengine.worker import gemv
from aioengine.worker.cpu.backend import PATHS
from aioengine.worker.cpu.decode_plan import DecodePlan
from aioengine.worker.cpu.layer_path import CpuLayerPath
from aioengine.worker.model_runner import ModelRunner
from aioengine.worker.quant import load_quant_kernel
from tests.worker.step_driver import StepDriver

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

BLOCK, BLOCKS = 4, 48
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


def _runner(quantization: str = "none", **switches: object) -> ModelRunner:
    r = ModelRunner(EngineConfig(model="tiny", device="cpu", dtype="float32", block_size=BLOCK,
                                 num_kv_blocks=BLOCKS, num_threads=1, quantization=quantization,
                                 cpu_kernels=CpuKernelConfig(**switches)))  # type: ignore[arg-type]
    r.allocate_kv_cache(BLOCKS)
    return r


def _greedy(r: ModelRunner, steps: int = 4) -> list[list[int]]:
    """Two prompts prefilled, then ``steps`` decode steps of both together: their tokens."""
    d = StepDriver(BLOCK, BLOCKS)
    d.add("a", [5, 9, 13, 2, 7], GREEDY)
    d.add("b", [3, 1, 4], GREEDY)
    for _ in range(steps + 1):
        d.apply(r.execute(d.step()))
    return [d.seqs["a"].outputs, d.seqs["b"].outputs]


def _plan(r: ModelRunner) -> DecodePlan | None:
    path = r.model.cpu_path
    assert isinstance(path, CpuLayerPath)
    plan = path._plan
    return plan if isinstance(plan, DecodePlan) else None


def test_the_default_is_the_lane_and_it_runs(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="aioengine.worker.cpu.backend"):
        r = _runner()
    assert (r.cpu_backend.path, r.cpu_backend.reason) == ("lane", "every CPU kernel switch on")
    assert [m for m in caplog.messages if m.startswith("CPU backend: lane path")], \
        caplog.messages
    assert r.cpu_backend.uses_gemv and r.uses_gemv_kernel
    _greedy(r)
    plan = _plan(r)
    assert plan is not None and plan.lane_runs == 4


def test_each_switch_picks_its_path_and_the_tokens_stay() -> None:
    want = _greedy(_runner())
    # cpu_ops off: the module path, nothing installed on the model
    r = _runner(cpu_ops=False)
    assert (r.cpu_backend.path, r.cpu_backend.reason) == ("module", "cpu_ops off")
    assert r.model.cpu_path is None
    assert _greedy(r) == want
    # decode_plan off: the layer ops' loop, no plan is ever built
    r = _runner(decode_plan=False)
    assert (r.cpu_backend.path, r.cpu_backend.reason) == ("layer ops", "decode_plan off")
    assert _greedy(r) == want
    assert r.model.cpu_path._plan is None  # type: ignore[union-attr]
    # decode_lane off: the plan runs the decode steps' layers, the lane none
    r = _runner(decode_lane=False)
    assert r.cpu_backend.path == "plan"
    assert _greedy(r) == want
    plan = _plan(r)
    assert plan is not None and plan.runs == 4 and plan.lane_runs == 0
    # decode_plan_split off: recorded in the plan
    r = _runner(decode_plan_split=False)
    _greedy(r)
    plan = _plan(r)
    assert plan is not None and plan.split is False and plan.lane_runs == 4
    assert PATHS == ("module", "layer ops", "plan", "lane")


def test_gemv_and_huge_pages_switches() -> None:
    try:
        r = _runner(cpu_gemv=False)
        assert not r.cpu_backend.uses_gemv and gemv._kernel is None
        assert r.cpu_backend.huge_page_bytes == 0
        _greedy(r)
        # float32 linears without the GEMV: the plan has nothing to run them with
        assert _plan(r) is None
        r = _runner(huge_pages=False)
        assert r.cpu_backend.uses_gemv and r.cpu_backend.huge_page_bytes == 0
    finally:  # the GEMV is process-wide: back as a default runner leaves it
        _runner()


def test_quant_switches_reach_the_weights_and_the_kernels() -> None:
    kern = load_quant_kernel()
    best = kern.best_level
    try:
        r = _runner("q8_0", quant_x8=False, quant_x8_prefill=False, quant_isa="scalar")
        policies = {q.policy for m in r.model.modules()
                    for q in (getattr(m, "qweight", None),) if q is not None}
        assert policies and all(not p.x8 and not p.x8_prefill for p in policies)
        assert kern.best_level == 0  # the cap is the process's library
        _greedy(r)
    finally:
        r = _runner("q8_0")
    assert kern.best_level == best  # a later runner with "best" lifts it
    policies = {q.policy for m in r.model.modules()
                for q in (getattr(m, "qweight", None),) if q is not None}
    assert all(p.x8 and p.x8_prefill for p in policies)

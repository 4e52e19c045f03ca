"""The CPU backend: how one loaded model executes on CPU, decided once when the ModelRunner
loads it, from the model and ``EngineConfig.cpu_kernels`` (``CpuKernelConfig``).

It owns the choice among the decode paths, so the model code (``worker/models/``) keeps only
the families' math and asks nothing:

- ``module``: the model's own modules (torch ops), for other devices and dtypes, models the
  layer ops do not cover, or the layer ops off or not built;
- ``layer ops``: each layer as its four linears and four compiled ops called from Python
  (``layer_path.CpuLayerPath``);
- ``plan``: a decode step's layers in one compiled call (``decode_plan.DecodePlan``), prefill
  and mixed steps still the layer ops;
- ``lane``: the plan's call also takes the embedding, rotary rows and LM head.

and, beside the path, the float32 linears (the compiled GEMV or torch's ``F.linear``), the
huge pages under the float32 weights, and the kernels' code-path cap. The chosen path and why
are logged once. Whether the plan and the lane then take a step is for them to say per KV
cache and step (a model they cannot run logs its reason once per set of caches).
"""

from __future__ import annotations

import logging

from aioengine.config import CpuKernelConfig
from aioengine.worker import gemv
from aioengine.worker.cpu.kernels.build import KernelBuildError
from aioengine.worker.cpu.layer_path import CpuLayerPath, uncovered
from aioengine.worker.models import CausalLM
from aioengine.worker.ops import load_cpu_ops

logger = logging.getLogger(__name__)

PATHS = ("module", "layer ops", "plan", "lane")
"""The decode paths, from the least compiled to the most."""


class CpuBackend:
    """Built by ``ModelRunner`` right after the model loads: configures the float32 GEMV, huge
    pages and the kernels' code path for this process, and installs the decode path on the
    model (``model.cpu_path``). ``path`` names it, ``reason`` says why."""

    def __init__(self, model: CausalLM, config: CpuKernelConfig, threads: int) -> None:
        self.config = config
        self.uses_gemv = gemv.configure(model.device, model.dtype, threads,
                                        enabled=config.cpu_gemv)
        # decode streams the weights: no prefetcher stop every 4 KiB (docs/benchmarks.md)
        self.huge_page_bytes = (gemv.huge_page_weights(model)
                                if self.uses_gemv and config.huge_pages else 0)
        if model.device.type == "cpu":
            _cap_code_path(model, config.quant_isa, self.uses_gemv)
        self.layer_path = layer_path(model, config)
        self.path, self.reason = _describe(model, config, self.layer_path)
        model.cpu_path = self.layer_path
        logger.info("CPU backend: %s path (%s); float32 linears by %s", self.path, self.reason,
                    "the compiled GEMV" if self.uses_gemv else "torch")


def layer_path(model: CausalLM, config: CpuKernelConfig) -> CpuLayerPath | None:
    """The compiled layer path for ``model`` under ``config`` (None: the module path), without
    the process-wide parts of the backend (tests that load a model without a runner)."""
    if not config.cpu_ops or uncovered(model) is not None:
        return None
    try:
        ops = load_cpu_ops()
    except KernelBuildError as e:
        logger.warning("CPU layer ops unavailable, torch ops instead: %s", e)
        return None
    return CpuLayerPath(model, ops, plan=config.decode_plan, split=config.decode_plan_split,
                        lane=config.decode_lane)


def _describe(model: CausalLM, config: CpuKernelConfig,
              path: CpuLayerPath | None) -> tuple[str, str]:
    """The path's name (``PATHS``) and why that one."""
    if path is None:
        why = uncovered(model)
        if why is None:
            why = "cpu_ops off" if not config.cpu_ops else "the layer ops could not be built"
        return "module", why
    if not path.plan:
        return "layer ops", "decode_plan off"
    if not path.lane:
        return "plan", "decode_lane off"
    return "lane", "every CPU kernel switch on"


def _cap_code_path(model: CausalLM, isa: str, uses_gemv: bool) -> None:
    """Cap the quantized and float32 kernels' code path at ``isa``. Applied whenever the
    library is in use, ``best`` too: the cap is process-wide, and another model loaded in this
    process may have set another."""
    from aioengine.worker.quant import load_quant_kernel

    quantized = any(getattr(m, "qweight", None) is not None
                    or getattr(m, "qhead", None) is not None
                    for m in model.modules())
    if isa == "best" and not quantized and not uses_gemv:
        return  # nothing runs the library
    try:
        load_quant_kernel().set_max_isa(isa)
    except KernelBuildError as e:  # then nothing runs it either
        logger.warning("quant_isa=%s not applied: the kernels are not built here: %s", isa, e)


__all__ = ["PATHS", "CpuBackend", "layer_path"]

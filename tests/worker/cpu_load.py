"""``load_model`` that leaves the model as a ``ModelRunner`` would run it on CPU: with the CPU
backend's decode path installed (``aioengine.worker.cpu.backend.layer_path``), without the
process-wide parts a runner also sets (the GEMV, huge pages, the kernels' code path), which
each test sets for itself."""

from __future__ import annotations

from typing import Any

from aioengine.config import CpuKernelConfig
from aioengine.worker import loader
from aioengine.worker.cpu.backend import layer_path
from aioengine.worker.models import CausalLM, ModelSpec


def load_model(*args: Any, cpu_kernels: CpuKernelConfig | None = None,
               **kwargs: Any) -> tuple[CausalLM, ModelSpec]:
    """``loader.load_model(*args, **kwargs)`` with the layer path ``cpu_kernels`` (default:
    every switch on) gives the model."""
    model, spec = loader.load_model(*args, **kwargs)
    model.cpu_path = layer_path(model, cpu_kernels or CpuKernelConfig())
    return model, spec

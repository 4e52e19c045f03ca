"""Quantized weights kept quantized in memory (GGUF block layouts) and computed by our own C
kernels: ``kernel`` (the library), ``quantize`` (float -> blocks), ``weight`` (a layer's
quantized weight and its forward)."""

from aioengine.worker.quant.kernel import (
    QTYPES,
    QType,
    QuantKernel,
    QuantKernelError,
    load_quant_kernel,
    qtype_of,
)
from aioengine.worker.quant.quantize import quantize

__all__ = ["QTYPES", "QType", "QuantKernel", "QuantKernelError", "load_quant_kernel",
           "qtype_of", "quantize"]

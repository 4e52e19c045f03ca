"""The suite registry: name -> module with ``run(options) -> list[Result]`` and ``BASELINE``
(the name every other row of the suite is compared with, or None)."""

from __future__ import annotations

import importlib
from types import ModuleType

SUITES: tuple[tuple[str, str, str], ...] = (
    ("transport", "aioengine.bench.transport", "IPC transports against stdlib baselines"),
    ("kernels", "aioengine.bench.kernels", "decode/prefill of the model runner against HF"),
    ("offline", "aioengine.bench.offline", "LLM.generate throughput against HF generate"),
    ("overhead", "aioengine.bench.overhead", "batch-1 decode through the client vs a bare loop"),
    ("serve", "aioengine.bench.serve", "online latency under Poisson arrivals"),
    ("peers", "aioengine.bench.peers", "decode/prefill/serving vs llama.cpp on one GGUF file"),
    ("scale", "aioengine.bench.scale", "data-parallel replicas vs one engine; prefix routing"),
    ("structured", "aioengine.bench.structured",
     "JSON-schema constrained decode vs unconstrained; grammar compile and mask times"),
    ("embed", "aioengine.bench.embed",
     "embeddings/s and rerank pairs/s vs sentence-transformers, with their agreement"),
)


def suite_names() -> list[str]:
    return [name for name, _, _ in SUITES]


def load(name: str) -> ModuleType:
    for suite, module, _ in SUITES:
        if suite == name:
            return importlib.import_module(module)
    raise ValueError(f"unknown bench suite {name!r}; known: {suite_names()}")

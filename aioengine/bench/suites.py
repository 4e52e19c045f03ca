"""The suite registry: name -> module with ``run(options) -> list[Result]`` and ``BASELINE``.
Later suites (offline, overhead, serve, kernels) add a line here and a module beside it."""

from __future__ import annotations

import importlib
from types import ModuleType

SUITES: tuple[tuple[str, str, str], ...] = (
    ("transport", "aioengine.bench.transport", "IPC transports against stdlib baselines"),
    ("kernels", "aioengine.bench.kernels", "decode/prefill of the model runner against HF"),
)


def suite_names() -> list[str]:
    return [name for name, _, _ in SUITES]


def load(name: str) -> ModuleType:
    for suite, module, _ in SUITES:
        if suite == name:
            return importlib.import_module(module)
    raise ValueError(f"unknown bench suite {name!r}; known: {suite_names()}")

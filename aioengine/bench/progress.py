"""One tqdm bar per suite, on stderr (so ``--json``/table output on stdout stays clean)."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """``with Progress(total, "offline", enabled) as bar: bar.step("label"); ...``; a no-op
    when disabled or when stderr is not a terminal (tqdm's ``disable=None``)."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="step", file=sys.stderr, disable=None)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()

    def label(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

"""Benchmark results: one ``Result`` per measured number, a JSON writer, and a table printer
that compares every row with the suite's baseline row."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from aioengine.runtime.cpu_info import cpu_model

LOWER_IS_BETTER_UNITS = frozenset({"us", "ms", "s", "%"})


@dataclass(frozen=True, slots=True)
class Result:
    suite: str
    name: str  # what was measured: a transport, a baseline, a model...
    metric: str  # e.g. rtt_p50_us, msgs_per_s_256B, gbytes_per_s_1MiB
    value: float
    unit: str
    # The raw measurements behind ``value`` (e.g. every request's latency), for CDF plots;
    # not written to JSON rows.
    samples: tuple[float, ...] = field(default=(), compare=False, repr=False)

    def row(self) -> dict[str, Any]:
        return {"suite": self.suite, "name": self.name, "metric": self.metric,
                "value": self.value, "unit": self.unit}

    @property
    def lower_is_better(self) -> bool:
        return self.unit in LOWER_IS_BETTER_UNITS


def machine_info() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def write_json(path: str, results: Iterable[Result], config: dict[str, Any]) -> None:
    doc = {"results": [r.row() for r in results], "machine": machine_info(),
           "config": config}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def _fmt(value: float) -> str:
    if value == 0 or 0.01 <= abs(value) < 100_000:
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:.3g}"


WIDE = 8  # more metrics than this (and than names): metrics become the rows


def print_table(results: list[Result], baseline: str | None, out: TextIO = sys.stdout) -> None:
    """Rows: names; columns: metrics (transposed when there are many metrics and few names,
    e.g. the serve suite's latency percentiles). Each cell shows the value and, against
    ``baseline``, a factor where > 1 always means better (faster, less CPU, more throughput)."""
    if not results:
        print("(no results)", file=out)
        return
    metrics = list(dict.fromkeys(r.metric for r in results))
    names = list(dict.fromkeys(r.name for r in results))
    cell = {(r.name, r.metric): r for r in results}
    base = {m: cell.get((baseline, m)) for m in metrics} if baseline else {}
    header = ["name", *[f"{m} [{_unit(results, m)}]" for m in metrics]]
    rows = [header]
    for name in names:
        row = [name]
        for m in metrics:
            r = cell.get((name, m))
            if r is None:
                row.append("-")
                continue
            text = _fmt(r.value)
            b = base.get(m)
            if b is not None and name != baseline and b.value and r.value:
                factor = b.value / r.value if r.lower_is_better else r.value / b.value
                text += f" ({factor:.2f}x)"
            row.append(text)
        rows.append(row)
    if len(metrics) > WIDE and len(metrics) > len(names):
        rows = [["metric", *names]] + [[h, *(row[i] for row in rows[1:])]
                                       for i, h in enumerate(header[1:], start=1)]
        header = rows[0]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for k, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)), file=out)
        if k == 0:
            print("  ".join("-" * w for w in widths), file=out)
    if baseline:
        print(f"(factors against {baseline}; > 1 is better)", file=out)


def _unit(results: list[Result], metric: str) -> str:
    return next(r.unit for r in results if r.metric == metric)

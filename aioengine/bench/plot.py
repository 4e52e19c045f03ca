"""PNG charts of bench results (needs the optional ``plot`` extra: matplotlib).

- one bar chart per (suite, metric) of scalar results (transport latencies, throughputs...);
- ``serve``: latency CDFs (TTFT, ITL, TPOT, E2E; one line per rate) from the samples the
  percentile rows carry, and achieved throughput against the offered request rate.
"""

from __future__ import annotations

import os
from typing import Any

from aioengine.bench.results import Result

LATENCIES = ("ttft", "itl", "tpot", "e2e")
THROUGHPUTS = ("output_tokens_per_s", "achieved_requests_per_s")


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` (Agg backend), or exit with a message saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(f"--plot needs matplotlib, an optional extra: pip install "
                         f"'aioengine[plot]' (or pip install matplotlib): {e}") from e
    return plt


def plot_results(results: list[Result], directory: str) -> list[str]:
    plt = require_matplotlib()
    os.makedirs(directory, exist_ok=True)
    paths: list[str] = []
    serve = [r for r in results if r.suite == "serve"]
    paths += _bars(plt, [r for r in results if r.suite != "serve"], directory)
    paths += _cdfs(plt, serve, directory)
    paths += _rate_curves(plt, serve, directory)
    return paths


def _save(plt: Any, fig: Any, directory: str, name: str) -> str:
    fig.tight_layout()
    path = os.path.join(directory, name)
    fig.savefig(path)
    plt.close(fig)
    return path


def _bars(plt: Any, results: list[Result], directory: str) -> list[str]:
    paths = []
    for suite, metric in dict.fromkeys((r.suite, r.metric) for r in results):
        rows = [r for r in results if r.suite == suite and r.metric == metric]
        fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.2), 3.5))
        ax.bar([r.name for r in rows], [r.value for r in rows])
        ax.set_title(f"{suite}: {metric}")
        ax.set_ylabel(rows[0].unit)
        ax.tick_params(axis="x", labelrotation=30)
        paths.append(_save(plt, fig, directory, f"{suite}_{metric}.png"))
    return paths


def _cdfs(plt: Any, serve: list[Result], directory: str) -> list[str]:
    paths = []
    for kind in LATENCIES:
        curves = {r.name: sorted(r.samples) for r in serve
                  if r.metric.startswith(f"{kind}_p") and r.samples}
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, xs in curves.items():
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
        ax.set_title(f"serve: {kind.upper()} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of samples")
        ax.legend()
        paths.append(_save(plt, fig, directory, f"serve_{kind}_cdf.png"))
    return paths


def _rate_curves(plt: Any, serve: list[Result], directory: str) -> list[str]:
    offered = {r.name: r.value for r in serve if r.metric == "offered_rate"}
    if not offered:
        return []
    fig, axes = plt.subplots(1, len(THROUGHPUTS), figsize=(10, 4))
    for ax, metric in zip(axes, THROUGHPUTS, strict=True):
        points = sorted((offered[r.name], r.value) for r in serve
                        if r.metric == metric and r.name in offered)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
        ax.set_xlabel("offered request rate (req/s)")
        ax.set_ylabel(metric)
        ax.set_title(f"serve: {metric}")
    return [_save(plt, fig, directory, "serve_throughput_vs_rate.png")]

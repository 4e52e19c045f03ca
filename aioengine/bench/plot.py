"""Bar charts of bench results (needs the optional ``plot`` extra: matplotlib)."""

from __future__ import annotations

import os

from aioengine.bench.results import Result


def plot_results(results: list[Result], directory: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(f"--plot needs matplotlib (pip install 'aioengine[plot]'): {e}") from e
    os.makedirs(directory, exist_ok=True)
    paths = []
    for suite, metric in dict.fromkeys((r.suite, r.metric) for r in results):
        rows = [r for r in results if r.suite == suite and r.metric == metric]
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.bar([r.name for r in rows], [r.value for r in rows])
        ax.set_title(f"{suite}: {metric}")
        ax.set_ylabel(rows[0].unit)
        fig.tight_layout()
        path = os.path.join(directory, f"{suite}_{metric}.png")
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths

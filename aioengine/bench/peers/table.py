"""Markdown tables of ``peers`` runs: ``python -m aioengine.bench.peers.table RUN.json ...``.

Reads the ``--json`` files of one or more ``python -m aioengine.bench peers`` runs (e.g. one per
file type, to keep each run short; a later file's figure replaces an earlier one's) and prints
the README's performance rows (``--format readme``, the default: suite | what | aioengine |
llama.cpp | ratio) or one table per file type with every metric (``--format full``, for
docs/benchmarks.md), each under the commands that produced it. Ratios are > 1 where we are
better: tok/s ours / theirs, times and memory theirs / ours.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from aioengine.bench.peers.serving import BASELINE, OURS

LOWER_IS_BETTER = ("ms", "s", "MB")
TYPE_NAMES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0",
              "q4_1": "Q4_1", "q4_k_m": "Q4_K_M", "q4_k_s": "Q4_K_S", "q6_k": "Q6_K"}


class Runs:
    """The figures of several runs: ``value(name, "q4_1.decode_tok_s_t1")``."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.cells: dict[tuple[str, str], tuple[float, str]] = {}
        self.commands: list[str] = []
        self.label = "peers (quick)" if all(d.get("config", {}).get("quick") for d in docs) \
            else "peers (full)"
        for doc in docs:
            rows = [r for r in doc.get("results", ()) if r.get("suite") == "peers"]
            if not rows:
                continue
            for r in rows:
                self.cells[(r["name"], r["metric"])] = (float(r["value"]), r["unit"])
            load = (doc.get("machine") or {}).get("load_average")
            self.commands.append(f"`{command_of(doc.get('config', {}))}`"
                                 + (f" (load average {load[0]:.1f} at the end)" if load else ""))
        self.types = list(dict.fromkeys(m.split(".", 1)[0] for _, m in self.cells if "." in m))

    def value(self, name: str, metric: str) -> float | None:
        got = self.cells.get((name, metric))
        return None if got is None else got[0]

    def unit(self, metric: str) -> str:
        return next((u for (_, m), (_, u) in self.cells.items() if m == metric), "")

    def ratio(self, metric: str) -> float | None:
        ours, theirs = self.value(OURS, metric), self.value(BASELINE, metric)
        if not ours or not theirs:
            return None
        return theirs / ours if self.unit(metric) in LOWER_IS_BETTER else ours / theirs


def command_of(config: dict[str, Any]) -> str:
    """The bench command line a run's ``config`` (its options) stands for."""
    parts = ["python -m aioengine.bench peers"]
    if config.get("quick"):
        parts.append("--quick")
    parts.append(f"--model {config.get('model', '?')}")
    if config.get("quants"):
        parts.append("--quants " + ",".join(config["quants"]))
    for key, flag in (("llama_cpp", "--llama-cpp"), ("quantization", "--quantization"),
                      ("threads", "--threads"), ("rate", "--rate")):
        if config.get(key) is not None:
            parts.append(f"{flag} {config[key]}")
    if config.get("only"):
        parts.append("--only " + ",".join(config["only"]))
    if config.get("x8") is False:
        parts.append("--no-x8")
    return " ".join(parts)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _joined(runs: Runs, name: str, metrics: list[str], fmt: Callable = _fmt) -> str:
    return " / ".join(fmt(runs.value(name, m)) for m in metrics)


def readme_rows(runs: Runs) -> list[str]:
    """The README's rows: per file type, decode, prefill, bandwidth, serving, memory."""
    return [line for t in runs.types for line in _type_rows(runs, t)]


def _type_rows(runs: Runs, t: str) -> list[str]:
    out: list[str] = []
    name = TYPE_NAMES.get(t, t)

    def row(what: str, metrics: list[str], baseline: bool = True) -> None:
        if all(runs.value(OURS, f"{t}.{m}") is None for m in metrics):
            return
        full = [f"{t}.{m}" for m in metrics]
        ratios = " / ".join(f"{r:.2f}x" if (r := runs.ratio(m)) else "-" for m in full)
        out.append(f"| {runs.label} | {name} GGUF, {what} | {_joined(runs, OURS, full)} | "
                   + (f"{_joined(runs, BASELINE, full)} | {ratios} |" if baseline
                      else "| |"))

    threads = sorted({int(m.rsplit("_t", 1)[1]) for (_, m) in runs.cells
                      if m.startswith(f"{t}.decode_tok_s_t") and m[-1].isdigit()})
    dec = [f"decode_tok_s_t{n}" for n in threads]
    default = runs.value(OURS, f"{t}.default_threads")
    if default is not None:
        dec.append("decode_tok_s_tdefault")
    ts = " / ".join(map(str, threads)) + (f" / default ({default:g})"
                                          if default is not None else "")
    row(f"batch-1 decode tok/s, {ts} threads", dec)
    pre = [m.split(".", 1)[1] for (n, m) in runs.cells if n == OURS
           and m.startswith(f"{t}.prefill") and not m.endswith("_tdefault")]
    if pre:
        length = pre[0].split("_", 1)[0].removeprefix("prefill")
        row(f"prefill {length} tok/s, " + " / ".join(p.rsplit("_t", 1)[1] for p in pre)
            + " threads", pre)
    row("decode weight reads / read bandwidth of their pages, "
        + " / ".join(f"t{n}" for n in threads),
        [f"decode_bw_fraction_t{n}" for n in threads], baseline=False)
    row("8 concurrent HTTP streams: output tok/s, ITL p50 / p90 ms, TTFT p50 ms",
        ["serve_output_tok_s", "serve_itl_p50_ms", "serve_itl_p90_ms",
         "serve_ttft_p50_ms"])
    stages = {m.split(".", 1)[1].split("_")[1] for (_, m) in runs.cells
              if m.startswith(f"{t}.serve_")}
    rates = sorted(float(s[:-3]) for s in stages if s.endswith("rps"))
    if rates:
        label = "/".join(f"{r:g}" for r in rates)
        row(f"Poisson {label} req/s: output tok/s",
            [f"serve_{r:g}rps_output_tok_s" for r in rates])
        row(f"Poisson {label} req/s: ITL p50 ms",
            [f"serve_{r:g}rps_itl_p50_ms" for r in rates])
        row(f"Poisson {label} req/s: TTFT p50 ms",
            [f"serve_{r:g}rps_ttft_p50_ms" for r in rates])
    row("resident MB under load (process tree); start-up to /health 200 s",
        ["serve_rss_mb", "serve_startup_s"])
    row("proportional MB under load (process tree, PSS: shared pages once)", ["serve_pss_mb"])
    return out


def full_tables(runs: Runs) -> list[str]:
    """One table per file type: every metric, both sides and the ratio."""
    out = []
    for t in runs.types:
        out += [f"\n**{TYPE_NAMES.get(t, t)}**\n", f"| metric | {BASELINE} | {OURS} | ratio |",
                "|---|---:|---:|---:|"]
        metrics = list(dict.fromkeys(m for (_, m) in runs.cells if m.startswith(f"{t}.")))
        for m in metrics:
            r = runs.ratio(m)
            ours = runs.value(OURS, m)
            ours = runs.value("machine", m) if ours is None else ours  # the read bandwidth
            out.append(f"| `{m.split('.', 1)[1]}` ({runs.unit(m)}) | "
                       f"{_fmt(runs.value(BASELINE, m))} | {_fmt(ours)} | "
                       f"{f'{r:.2f}x' if r else ''} |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aioengine.bench.peers.table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN.json", help="--json files of peers runs")
    p.add_argument("--format", choices=("readme", "full"), default="readme")
    args = p.parse_args(argv)
    docs = []
    for path in args.runs:
        try:
            with open(path) as f:
                docs.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"{p.prog}: error: cannot read {path}: {e}", file=sys.stderr)
            return 2
    runs = Runs(docs)
    if not runs.cells:
        print(f"{p.prog}: error: no peers results in {', '.join(args.runs)}", file=sys.stderr)
        return 2
    lines = ["Commands: " + "; ".join(runs.commands), ""]
    if args.format == "readme":
        lines += ["| suite | what | aioengine | baseline: llama.cpp | ratio (> 1: ours better) |",
                  "|---|---|---:|---:|---:|", *readme_rows(runs)]
    else:
        lines += full_tables(runs)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

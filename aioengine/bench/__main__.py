"""``python -m aioengine.bench [SUITE] [--model M] [--quick] [--json FILE] [--plot DIR]``.

No suite named: every suite, one after the other (``--quick``: the default quick run that
``make bench`` does). Progress bars go to stderr while suites run; at the end, one table per
suite with factors against its baseline row. A suite that fails is reported (and makes the
exit status 1) without losing the others' results. Ctrl-C ends it with one line and status 130
at any moment: while it imports, at once; while a suite runs, once ``KeyboardInterrupt`` has
unwound the suite (its engines shut down on the way), or at once on a second Ctrl-C or when
that takes over ``UNWIND_DEADLINE`` seconds.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from dataclasses import asdict

from aioengine.program_interrupt import (
    INTERRUPTED_EXIT,
    exit_at_once_on_sigint,
    interrupted_line,
    unwind_on_sigint,
    unwound,
)

PROG = "python -m aioengine.bench"
UNWIND_DEADLINE = 20  # seconds a Ctrl-C may take to shut the suite's engines down
if __name__ == "__main__":  # before the imports below: Ctrl-C meanwhile is one line, too
    exit_at_once_on_sigint(PROG)

from aioengine.bench import suites  # noqa: E402
from aioengine.bench.options import BenchOptions  # noqa: E402
from aioengine.bench.results import Result, print_table, write_json  # noqa: E402
from aioengine.field_args import add_field_args, field_help, values_from_args  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG,
                                description="Benchmarks of aioengine and its transports.")
    p.add_argument("suite", nargs="?", default="all", choices=["all", *suites.suite_names()],
                   help="which suite to run (default: all)")
    # The options every suite reads are BenchOptions fields: help from their docstrings.
    add_field_args(p, BenchOptions, exclude=("only",),
                   metavars={"model": "M", "rate": "R", "endpoint": "URL", "threads": "N",
                             "llama_cpp": "DIR", "quants": "Q"})
    p.add_argument("--only", default="", metavar="A,B",
                   help=field_help(BenchOptions, "only") + " (default: every name)")
    p.add_argument("--json", metavar="FILE", help="write results, machine and config as JSON")
    p.add_argument("--plot", metavar="DIR",
                   help="write PNG charts (bars per metric, latency CDFs, throughput against "
                        "request rate); needs matplotlib")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The options of parsed arguments (``--only`` is one comma-separated string)."""
    values = values_from_args(BenchOptions, args)
    values["only"] = tuple(n for n in args.only.split(",") if n)
    return BenchOptions(**values)


def main(argv: list[str] | None = None) -> int:
    try:
        # From here on Ctrl-C raises KeyboardInterrupt: suites hold engines that are shut down
        # on the way out.
        unwind_on_sigint(PROG, UNWIND_DEADLINE)
        return _main(argv)
    except KeyboardInterrupt:
        unwound()
        print(interrupted_line(PROG), file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        options = options_from_args(args)
        _check_model(args.model)
    except (ValueError, FileNotFoundError) as e:
        print(f"python -m aioengine.bench: error: {e}", file=sys.stderr)
        return 2
    if args.plot:  # fail before minutes of measuring, not after
        from aioengine.bench.plot import require_matplotlib

        require_matplotlib()
    names = suites.suite_names() if args.suite == "all" else [args.suite]
    done: list[tuple[str, str | None, list[Result], float]] = []
    failed: list[tuple[str, str]] = []
    t0 = time.perf_counter()
    for name in names:
        module = suites.load(name)
        start = time.perf_counter()
        try:
            got = module.run(options)
        except Exception:  # one broken suite must not cost the others' results
            failed.append((name, traceback.format_exc()))
            print(f"suite {name} failed:\n{failed[-1][1]}", file=sys.stderr, flush=True)
            continue
        done.append((name, getattr(module, "BASELINE", None), got, time.perf_counter() - start))
    for name, baseline, got, secs in done:
        print(f"\n== {name} ({secs:.0f} s) ==")
        print_table(got, baseline)
    results = [r for _, _, got, _ in done for r in got]
    print(f"\n{len(done)} suite(s) in {time.perf_counter() - t0:.0f} s"
          + (f"; FAILED: {', '.join(n for n, _ in failed)}" if failed else ""))
    if args.json:
        write_json(args.json, results, {"suites": [n for n, *_ in done],
                                        "failed": [n for n, _ in failed], **asdict(options)})
        print(f"wrote {args.json}")
    if args.plot:
        from aioengine.bench.plot import plot_results

        for path in plot_results(results, args.plot):
            print(f"wrote {path}")
    return 1 if failed else 0


def _check_model(model: str) -> None:
    """A missing or malformed model directory is an error now, not a child's traceback."""
    from aioengine.hub import resolve_model

    resolve_model(model, require_tokenizer=True)


if __name__ == "__main__":
    sys.exit(main())

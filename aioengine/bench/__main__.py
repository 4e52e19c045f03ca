"""``python -m aioengine.bench [SUITE] [--model M] [--quick] [--json FILE] [--plot DIR]``."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict

from aioengine.bench import suites
from aioengine.bench.options import BenchOptions
from aioengine.bench.results import Result, print_table, write_json


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m aioengine.bench",
                                description="Benchmarks of aioengine and its transports.")
    p.add_argument("suite", nargs="?", default="all", choices=["all", *suites.suite_names()],
                   help="which suite to run (default: all)")
    p.add_argument("--model", default="tiny", help="model for the model suites (default: tiny)")
    p.add_argument("--quick", action="store_true", help="small sizes: seconds, not minutes")
    p.add_argument("--only", default="",
                   help="comma-separated names to restrict a suite to (e.g. uds,mp_queue)")
    p.add_argument("--json", metavar="FILE", help="write results, machine and config as JSON")
    p.add_argument("--plot", metavar="DIR", help="write one bar chart per metric (matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = BenchOptions(quick=args.quick, model=args.model,
                           only=tuple(n for n in args.only.split(",") if n),
                           progress=not args.no_progress)
    names = suites.suite_names() if args.suite == "all" else [args.suite]
    results: list[Result] = []
    for name in names:
        module = suites.load(name)
        got = module.run(options)
        print(f"\n== {name} ==")
        print_table(got, getattr(module, "BASELINE", None))
        results.extend(got)
    if args.json:
        write_json(args.json, results, {"suites": names, **asdict(options)})
        print(f"\nwrote {args.json}")
    if args.plot:
        from aioengine.bench.plot import plot_results

        for path in plot_results(results, args.plot):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

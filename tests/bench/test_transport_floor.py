"""The transport table compares each column with its own floor: latency with os_pipe,
bandwidth with memcpy, messages per second with mp_pipe (one reference row carries them)."""

from __future__ import annotations

import io

from aioengine.bench import transport as B
from aioengine.bench.results import Result, print_table


def _r(name: str, metric: str, value: float, unit: str) -> Result:
    return Result(B.SUITE, name, metric, value, unit)


RESULTS = [
    _r("mp_queue", "msgs_per_s_256B", 20_000.0, "msg/s"),
    _r("mp_pipe", "rtt_p50_us", 40.0, "us"),
    _r("mp_pipe", "msgs_per_s_256B", 50_000.0, "msg/s"),
    _r("os_pipe", "rtt_p50_us", 10.0, "us"),
    _r("os_pipe", "rtt_p99_us", 20.0, "us"),
    _r("memcpy", "gbytes_per_s_1MiB", 20.0, "GB/s"),
    _r("memcpy", "gbytes_per_s_16MiB", 8.0, "GB/s"),
    _r("shm", "rtt_p50_us", 20.0, "us"),
    _r("shm", "rtt_p99_us", 80.0, "us"),
    _r("shm", "msgs_per_s_256B", 100_000.0, "msg/s"),
    _r("shm", "gbytes_per_s_1MiB", 5.0, "GB/s"),
    _r("shm", "gbytes_per_s_16MiB", 4.0, "GB/s"),
    _r("shm", "idle_cpu_percent", 0.0, "%"),
    _r("shm", "bcast2_msgs_per_s_256B", 70_000.0, "msg/s"),
]


def test_the_floor_row_takes_each_metric_from_its_own_baseline() -> None:
    floor = {r.metric: r.value for r in B.floor_row(RESULTS)}
    assert floor == {"rtt_p50_us": 10.0, "rtt_p99_us": 20.0, "msgs_per_s_256B": 50_000.0,
                     "gbytes_per_s_1MiB": 20.0, "gbytes_per_s_16MiB": 8.0}
    assert {r.name for r in B.floor_row(RESULTS)} == {B.BASELINE}


def test_the_table_shows_factors_against_each_floor_and_names_them() -> None:
    out = io.StringIO()
    print_table(B.floor_row(RESULTS) + RESULTS, B.BASELINE, out=out)
    shm = next(line for line in out.getvalue().splitlines() if line.startswith("shm "))
    # rtt 20 us vs the pipe's 10 (0.50x), p99 80 vs 20 (0.25x); 100k msg/s vs mp_pipe's 50k
    # (2.00x, not 5.00x against mp_queue); 5 and 4 GB/s vs memcpy's 20 and 8.
    for cell in ("20 (0.50x)", "80 (0.25x)", "1e+05 (2.00x)", "5 (0.25x)", "4 (0.50x)"):
        assert cell in shm, shm
    footer = out.getvalue().splitlines()[-1]
    assert "os_pipe" in footer and "memcpy" in footer and "mp_pipe" in footer


def test_without_the_baselines_there_is_no_floor_row() -> None:
    ours = [r for r in RESULTS if r.name == "shm"]
    assert B.floor_row(ours) == []

"""Round trips are timed in interleaved rounds (os_pipe and each transport once per round, in a
rotated order) and reported as medians over rounds; the table keeps baselines on top."""

from __future__ import annotations

import pytest

from aioengine.bench import transport as B
from aioengine.bench.results import Result


def test_each_round_starts_one_contender_later() -> None:
    names = ["os_pipe", "shm", "uds"]
    assert [B.rotated(names, i) for i in range(4)] == [
        ["os_pipe", "shm", "uds"], ["shm", "uds", "os_pipe"], ["uds", "os_pipe", "shm"],
        ["os_pipe", "shm", "uds"]]
    assert B.rotated([], 3) == []


@pytest.mark.parametrize("with_floor", [True, False])
def test_rounds_measure_every_contender_with_real_peers(with_floor: bool) -> None:
    sizes = B.Sizes(rtt_iters=40, rtt_rounds=2, msgs_256=0, n_1mib=0, n_16mib=0,
                    bcast_msgs=0, idle_s=0.0)
    got = B.rtt_rounds(["uds"], with_floor, sizes)
    names = ["os_pipe", "uds"] if with_floor else ["uds"]
    assert [(r.name, r.metric) for r in got] == [
        (n, m) for n in names for m in ("rtt_p50_us", "rtt_p99_us")]
    by = {(r.name, r.metric): r.value for r in got}
    for n in names:
        assert 0 < by[(n, "rtt_p50_us")] <= by[(n, "rtt_p99_us")]


def test_rows_keep_baselines_first_whatever_ran_first() -> None:
    ran = [Result(B.SUITE, name, "rtt_p50_us", 1.0, "us")
           for name in ("os_pipe", "shm", "mp_queue", "uds", "memcpy", "zmq", "mp_pipe")]
    order = [r.name for r in B.row_order(ran)]
    assert order[:4] == ["mp_queue", "mp_pipe", "os_pipe", "memcpy"]
    assert sorted(order[4:]) == ["shm", "uds", "zmq"]

"""The ``transport`` suite: our transports (uds, zmq, shm) against stdlib baselines.

Every peer runs in a separate spawned process. Metrics: round-trip latency of 256 B messages
(p50, p99), one-way messages per second at 256 B, GB/s at 1 MiB and 16 MiB, broadcast to two
readers (messages per second at 256 B), and the CPU an idle waiting reader burns. Every size is
warmed up before it is timed, for every contender alike: one-time costs (first-touch page faults
of fresh buffers) are not throughput; and every transport buffers the same (``CAPACITY``).

Factors in the table are against the floor of each metric, in one reference row: latency
against ``os_pipe`` (a bare pipe ping-pong: the kernel wake-up floor), bandwidth against
``memcpy`` (one in-process copy), messages per second against ``mp_pipe``. The broadcast and
idle-CPU columns have no floor.

Round trips drift on a shared or virtual machine (an ``os_pipe`` p50 can change by an order of
magnitude from one minute to the next, as idle vCPUs halt or not; docs/benchmarks.md), so
``os_pipe`` and our transports are timed in interleaved rounds -- each round times every
contender once, in an order rotated from round to round -- and each reports the median over
rounds of its per-round p50 and p99. A drift then moves the floor and the transports alike
instead of favouring whichever ran in a quiet minute.
(``mp_queue``/``mp_pipe`` round trips are timed once, with their other metrics.)
"""

from __future__ import annotations

import importlib
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import transports as T
from aioengine.bench import transport_baselines as B
from aioengine.bench.options import BenchOptions
from aioengine.bench.results import Result

SUITE = "transport"
T_ = TypeVar("T_")
# metric -> the baseline that is its floor; BASELINE names the row that carries them all.
FLOORS = {"rtt_p50_us": "os_pipe", "rtt_p99_us": "os_pipe", "msgs_per_s_256B": "mp_pipe",
          "gbytes_per_s_1MiB": "memcpy", "gbytes_per_s_16MiB": "memcpy"}
BASELINE = "floor (rtt: os_pipe, GB/s: memcpy, msg/s: mp_pipe)"
WARMUP = 2  # messages of each size sent before timing that size
MiB = 1024 * 1024
# Every transport's data channel gets the same buffering: 64 MiB, the zmq/uds default. For shm
# that is a ring holding a 16 MiB message in place; its own default ring (16 MiB, sized for an
# engine's small messages) would stream such a message through a copy.
CAPACITY = 64 * MiB
STALL = 120.0  # a step that makes no progress for this long is a bug: fail, do not hang


@dataclass(frozen=True)
class Sizes:
    rtt_iters: int  # round trips per contender, split over rtt_rounds interleaved rounds
    rtt_rounds: int
    msgs_256: int
    n_1mib: int
    n_16mib: int
    bcast_msgs: int
    idle_s: float


FULL = Sizes(rtt_iters=20_000, rtt_rounds=5, msgs_256=200_000, n_1mib=1000, n_16mib=64,
             bcast_msgs=100_000, idle_s=5.0)
QUICK = Sizes(rtt_iters=3000, rtt_rounds=3, msgs_256=10_000, n_1mib=60, n_16mib=6, bcast_msgs=5000,
              idle_s=1.0)


class Child:
    """A ``transport_peers`` program; ``ready()`` returns the address it printed."""

    def __init__(self, *args: object) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aioengine.bench.transport_peers", *map(str, args)],
            stdout=subprocess.PIPE, text=True)

    def ready(self, timeout: float = 120.0) -> str:
        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise TimeoutError(f"bench peer {self.proc.args} did not start in {timeout} s")
        words = self.proc.stdout.readline().split()
        if not words or words[0] != "ready":
            raise RuntimeError(f"bench peer {self.proc.args} failed to start")
        return words[1]

    def finish(self) -> None:
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# ---- our transports -------------------------------------------------------------------------
def rtt(kind: str, iters: int) -> list[Result]:
    w = T.open_writer(kind, capacity=CAPACITY)
    child = Child("echo", kind, w.address)
    r = T.open_reader(child.ready())
    try:
        msg = b"x" * 256
        for _ in range(100):  # warm-up
            w.send(msg, timeout=STALL)
            r.recv(timeout=STALL)
        times = []
        clock = time.perf_counter_ns
        for _ in range(iters):
            t0 = clock()
            w.send(msg, timeout=STALL)
            r.recv(timeout=STALL)
            times.append((clock() - t0) / 1000)
    finally:
        w.close()
        r.close()
        child.finish()
    times.sort()
    return [Result(SUITE, kind, "rtt_p50_us", percentile(times, 0.50), "us"),
            Result(SUITE, kind, "rtt_p99_us", percentile(times, 0.99), "us")]


def rotated(items: list[T_], i: int) -> list[T_]:
    """``items`` starting at position ``i`` (mod its length): round i's running order."""
    k = i % len(items) if items else 0
    return items[k:] + items[:k]


def rtt_rounds(kinds: list[str], with_floor: bool, sizes: Sizes) -> list[Result]:
    """Round trips of ``os_pipe`` (if ``with_floor``) and each of ``kinds`` in interleaved
    rounds (see the module docstring): per contender, the median of its rounds' p50 and p99."""
    contenders: list[tuple[str, Callable[[int], list[Result]]]] = [
        (kind, lambda n, k=kind: rtt(k, n)) for kind in kinds]
    if with_floor:
        contenders.insert(0, ("os_pipe", B.os_pipe_rtt))
    iters = max(1, sizes.rtt_iters // sizes.rtt_rounds)
    per_round: dict[tuple[str, str], list[Result]] = {}
    for i in range(sizes.rtt_rounds):
        for _, measure in rotated(contenders, i):
            for r in measure(iters):
                per_round.setdefault((r.name, r.metric), []).append(r)
    return [Result(SUITE, name, metric, statistics.median(r.value for r in rs), rs[0].unit)
            for (name, metric), rs in per_round.items()]


def _burst(w: T.SyncWriter, acks: list[T.SyncReader], size: int, n: int) -> float:
    """Seconds to push ``n`` messages through and hear every sink acknowledge the end."""
    header, buffers = (b"D" * size, []) if size <= 256 else (b"D", [bytes(size)])
    t0 = time.perf_counter()
    for _ in range(n):
        w.send(header, buffers, timeout=STALL)
    w.send(b"E", timeout=STALL)
    for a in acks:
        a.recv(timeout=STALL)
    return time.perf_counter() - t0


def one_way(kind: str, sizes: Sizes) -> list[Result]:
    w = T.open_writer(kind, capacity=CAPACITY)
    child = Child("sink", kind, w.address)
    ack = T.open_reader(child.ready())
    try:
        _burst(w, [ack], 256, 500)  # warm-up
        secs = _burst(w, [ack], 256, sizes.msgs_256)
        out = [Result(SUITE, kind, "msgs_per_s_256B", sizes.msgs_256 / secs, "msg/s")]
        for size, n, metric in ((MiB, sizes.n_1mib, "gbytes_per_s_1MiB"),
                                (16 * MiB, sizes.n_16mib, "gbytes_per_s_16MiB")):
            _burst(w, [ack], size, WARMUP)
            secs = _burst(w, [ack], size, n)
            out.append(Result(SUITE, kind, metric, n * size / secs / 1e9, "GB/s"))
        return out
    finally:
        w.close()
        ack.close()
        child.finish()


def broadcast(kind: str, sizes: Sizes) -> list[Result]:
    w = T.open_broadcast_writer(kind, 2, capacity=CAPACITY)
    children = [Child("bsink", kind, w.address, rank) for rank in range(2)]
    acks = [T.open_reader(c.ready()) for c in children]
    try:
        _burst(w, acks, 256, 500)
        secs = _burst(w, acks, 256, sizes.bcast_msgs)
        return [Result(SUITE, kind, "bcast2_msgs_per_s_256B", sizes.bcast_msgs / secs, "msg/s")]
    finally:
        w.close()
        for a in acks:
            a.close()
        for c in children:
            c.finish()


def idle_cpu(kind: str, sizes: Sizes) -> list[Result]:
    w = T.open_writer(kind, capacity=CAPACITY)
    child = Child("idle", kind, w.address)
    try:
        child.ready()  # it now waits in recv(); nothing is ever sent
        return [Result(SUITE, kind, "idle_cpu_percent",
                       B.cpu_percent_while_idle(child.proc.pid, sizes.idle_s), "%")]
    finally:
        w.close()
        child.finish()


def available_transports() -> list[str]:
    names = []
    for name in T.transport_names():
        try:
            importlib.import_module(f"transports.{name}")
        except ImportError:
            continue
        names.append(name)
    return names


def tasks(options: BenchOptions) -> list[tuple[str, Callable[[Sizes], list[Result]]]]:
    """(label, measurement) pairs in run order: the interleaved round trips, the baselines,
    then each transport's other metrics."""
    todo: list[tuple[str, Callable[[Sizes], list[Result]]]] = []
    kinds = [kind for kind in available_transports() if options.wants(kind)]
    floor = options.wants("os_pipe")
    if kinds or floor:
        todo.append(("rtt rounds", lambda s: rtt_rounds(kinds, floor, s)))
    for name, fn in B.BASELINES:
        if options.wants(name):
            todo.append((name, fn))
    for kind in kinds:
        for fn in (one_way, broadcast, idle_cpu):
            todo.append((f"{kind}:{fn.__name__}", lambda s, k=kind, f=fn: f(k, s)))
    return todo


def row_order(results: list[Result]) -> list[Result]:
    """Baseline rows first (in BASELINES order, os_pipe among them), then the transports, so
    tables read top-down whatever order the measurements ran in."""
    rank = {name: i for i, name in enumerate([*B.ROW_NAMES, *available_transports()])}
    return sorted(results, key=lambda r: rank.get(r.name, len(rank)))


def floor_row(results: list[Result]) -> list[Result]:
    """The reference row: each metric's floor (see FLOORS) copied under the name BASELINE, so
    the table's factors compare every row with the floor of each column."""
    cell = {(r.name, r.metric): r for r in results}
    return [Result(SUITE, BASELINE, metric, r.value, r.unit)
            for metric, name in FLOORS.items() if (r := cell.get((name, metric))) is not None]


def run(options: BenchOptions) -> list[Result]:
    sizes = QUICK if options.quick else FULL
    todo = tasks(options)
    results: list[Result] = []
    bar = _progress(len(todo), options.progress)
    try:
        for label, fn in todo:
            if bar is not None:
                bar.set_postfix_str(label)
            results.extend(fn(sizes))
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    results = row_order(results)
    return floor_row(results) + results


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="transport", unit="step", file=sys.stderr, disable=None)

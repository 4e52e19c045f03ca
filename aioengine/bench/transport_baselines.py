"""Baselines for the transport suite, measured the same way in the same run:
``multiprocessing.Queue`` and ``multiprocessing.Pipe`` (spawned children), an ``os.pipe``
ping-pong with a child interpreter (the kernel wake-up floor), and an in-process ``memcpy``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

from aioengine.bench.results import Result

SUITE = "transport"
MiB = 1024 * 1024
WARMUP = 2  # messages of each size sent before timing it (as in transport.one_way)


def cpu_percent_while_idle(pid: int, seconds: float) -> float:
    proc = psutil.Process(pid)
    time.sleep(0.2)  # let it settle into its wait
    before = proc.cpu_times()
    time.sleep(seconds)
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / seconds


def _percentiles(times: list[float]) -> tuple[float, float]:
    times.sort()
    n = len(times)
    return times[n // 2], times[min(n - 1, int(0.99 * n))]


# ---- multiprocessing children (module level: spawn imports them by name) ---------------------
def _queue_echo(inbox: Any, outbox: Any) -> None:
    while (item := inbox.get()) is not None:
        outbox.put(item)


def _queue_sink(inbox: Any, outbox: Any) -> None:
    while (item := inbox.get()) is not None:
        if item == b"E":
            outbox.put(b"A")


def _pipe_echo(conn: Any) -> None:
    while (data := conn.recv_bytes()) != b"":
        conn.send_bytes(data)


def _pipe_sink(conn: Any) -> None:
    while (data := conn.recv_bytes()) != b"":
        if data == b"E":
            conn.send_bytes(b"A")


class _MpPeer:
    """put/get for a Queue pair or a duplex Pipe, so one measurement code serves both."""

    def __init__(self, kind: str, role: str) -> None:
        ctx = mp.get_context("spawn")
        if kind == "mp_queue":
            self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
            target = _queue_echo if role == "echo" else _queue_sink
            self.proc = ctx.Process(target=target, args=(self.inbox, self.outbox))
            self.put, self.get = self.inbox.put, self.outbox.get
            self._stop: Callable[[], None] = lambda: self.inbox.put(None)
        else:
            here, there = ctx.Pipe(duplex=True)
            target = _pipe_echo if role == "echo" else _pipe_sink
            self.proc = ctx.Process(target=target, args=(there,))
            self.put, self.get = here.send_bytes, here.recv_bytes
            self._stop = lambda: here.send_bytes(b"")
        self.proc.start()

    def close(self) -> None:
        self._stop()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def mp_rtt(kind: str, iters: int) -> list[Result]:
    peer = _MpPeer(kind, "echo")
    try:
        msg = b"x" * 256
        for _ in range(100):
            peer.put(msg)
            peer.get()
        times = []
        clock = time.perf_counter_ns
        for _ in range(iters):
            t0 = clock()
            peer.put(msg)
            peer.get()
            times.append((clock() - t0) / 1000)
    finally:
        peer.close()
    p50, p99 = _percentiles(times)
    return [Result(SUITE, kind, "rtt_p50_us", p50, "us"),
            Result(SUITE, kind, "rtt_p99_us", p99, "us")]


def mp_one_way(kind: str, n256: int, n1: int, n16: int) -> list[Result]:
    peer = _MpPeer(kind, "sink")
    out = []
    try:
        for size, n, metric in ((256, n256, "msgs_per_s_256B"), (MiB, n1, "gbytes_per_s_1MiB"),
                                (16 * MiB, n16, "gbytes_per_s_16MiB")):
            data = bytes(size)
            for _ in range(WARMUP):  # as for our transports: first touches are not throughput
                peer.put(data)
            peer.put(b"E")
            peer.get()
            t0 = time.perf_counter()
            for _ in range(n):
                peer.put(data)
            peer.put(b"E")
            peer.get()
            secs = time.perf_counter() - t0
            value, unit = (n / secs, "msg/s") if size == 256 else (n * size / secs / 1e9, "GB/s")
            out.append(Result(SUITE, kind, metric, value, unit))
    finally:
        peer.close()
    return out


def mp_idle(kind: str, seconds: float) -> list[Result]:
    peer = _MpPeer(kind, "echo")
    try:
        return [Result(SUITE, kind, "idle_cpu_percent",
                       cpu_percent_while_idle(peer.proc.pid, seconds), "%")]
    finally:
        peer.close()


# ---- os.pipe: the floor -------------------------------------------------------------------
_PIPE_ECHO = """
import os, sys
r, w = int(sys.argv[1]), int(sys.argv[2])
while True:
    data = os.read(r, 65536)
    if not data:
        break
    os.write(w, data)
"""


def os_pipe_rtt(iters: int) -> list[Result]:
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", _PIPE_ECHO, str(down_r), str(up_w)],
                            pass_fds=(down_r, up_w))
    os.close(down_r)
    os.close(up_w)
    try:
        msg = b"x" * 256
        for _ in range(100):
            os.write(down_w, msg)
            os.read(up_r, 256)
        times = []
        clock = time.perf_counter_ns
        for _ in range(iters):
            t0 = clock()
            os.write(down_w, msg)
            got = 0
            while got < 256:
                got += len(os.read(up_r, 256 - got))
            times.append((clock() - t0) / 1000)
    finally:
        os.close(down_w)
        proc.wait(30)
        os.close(up_r)
    p50, p99 = _percentiles(times)
    return [Result(SUITE, "os_pipe", "rtt_p50_us", p50, "us"),
            Result(SUITE, "os_pipe", "rtt_p99_us", p99, "us")]


def memcpy(n1: int, n16: int) -> list[Result]:
    out = []
    for size, n, metric in ((MiB, n1, "gbytes_per_s_1MiB"), (16 * MiB, n16, "gbytes_per_s_16MiB")):
        src, dst = bytearray(os.urandom(1024)) * (size // 1024), bytearray(size)
        view = memoryview(dst)
        view[:] = src  # warm the pages
        t0 = time.perf_counter()
        for _ in range(n):
            view[:] = src
        out.append(Result(SUITE, "memcpy", metric, n * size / (time.perf_counter() - t0) / 1e9,
                          "GB/s"))
    return out


def _mp(kind: str) -> Callable[[Any], list[Result]]:
    def measure(s: Any) -> list[Result]:
        return (mp_rtt(kind, s.rtt_iters) + mp_one_way(kind, s.msgs_256, s.n_1mib, s.n_16mib)
                + mp_idle(kind, s.idle_s))
    return measure


BASELINES: tuple[tuple[str, Callable[[Any], list[Result]]], ...] = (
    ("mp_queue", _mp("mp_queue")),
    ("mp_pipe", _mp("mp_pipe")),
    ("memcpy", lambda s: memcpy(s.n_1mib * 4, s.n_16mib * 4)),
)
"""Baselines measured on their own; ``os_pipe`` (round trips only) is timed in the suite's
interleaved rounds with the transports instead (``transport.rtt_rounds``)."""
ROW_NAMES = ("mp_queue", "mp_pipe", "os_pipe", "memcpy")
"""Every baseline row, in table order."""

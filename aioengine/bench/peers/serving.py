"""The serving rows of the ``peers`` suite: ``python -m aioengine.serve`` and ``llama-server``
on the same file, both up at once, driven alternately through the same HTTP driver with the
same requests: 8 concurrent streams (closed loop), then Poisson arrivals at each rate."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from aioengine.bench.latency import RequestRecord, percentile
from aioengine.bench.peers import procs
from aioengine.bench.workload import Workload

BASELINE = "llama.cpp"
OURS = "aioengine"
START_TIMEOUT = 300.0
RATE_TIMEOUT = 900.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc: subprocess.Popen, t0: float) -> float:
    while time.perf_counter() - t0 < START_TIMEOUT:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before /health")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url}/health did not answer 200 within {START_TIMEOUT:.0f} s")


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def _kb(path: str, field: str) -> int | None:
    """``field``'s kB in a /proc file (None: the process is gone or the file unreadable)."""
    try:
        with open(path) as f:
            m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def tree_rss_mb(pid: int) -> float:
    """Resident MB of a process and all its descendants: each one's VmRSS, so a page several
    of them map (shared memory rings, shared libraries) counts once per process."""
    return sum(_kb(f"/proc/{p}/status", "VmRSS") or 0 for p in tree_pids(pid)) / 1024


def tree_pss_mb(pid: int) -> float | None:
    """Proportional set size of the tree in MB (``/proc/PID/smaps_rollup``, Linux >= 4.14): a
    page mapped by N processes counts 1/N in each, so pages the tree's processes share count
    once. Pages shared with processes outside the tree (the same libraries loaded elsewhere)
    are split with those too. None where the kernel has no smaps_rollup."""
    if not os.path.exists("/proc/self/smaps_rollup"):
        return None
    return sum(_kb(f"/proc/{p}/smaps_rollup", "Pss") or 0 for p in tree_pids(pid)) / 1024


def server_command(kind: str, bindir: Path | None, model: str, port: int, threads: int,
                   streams: int, ctx: int, quantization: str | None = None) -> list[str]:
    """llama-server at ``threads`` with ``streams`` slots of ``ctx`` tokens, or our server with
    the engine's own thread policy (what a user gets) and ``streams`` sequences at most."""
    if kind == BASELINE:
        if bindir is None:
            raise ValueError("llama-server's command needs the llama.cpp directory")
        return [str(bindir / "llama-server"), "-m", model, "--port", str(port), "-t",
                str(threads), "--parallel", str(streams), "-c", str(ctx * streams),
                "--host", "127.0.0.1"]
    ours = [sys.executable, "-m", "aioengine.serve", "--model", model, "--port", str(port),
            "--host", "127.0.0.1", "--max-model-len", str(ctx), "--max-num-seqs", str(streams)]
    return ours + (["--quantization", quantization] if quantization else [])


@dataclass
class Server:
    kind: str
    url: str
    pid: int
    startup_s: float
    rss_mb: float = 0.0  # the most seen so far
    pss_mb: float | None = 0.0  # the most seen so far; None without smaps_rollup

    def sample_memory(self) -> None:
        self.rss_mb = max(self.rss_mb, tree_rss_mb(self.pid))
        pss = tree_pss_mb(self.pid)
        self.pss_mb = None if pss is None or self.pss_mb is None else max(self.pss_mb, pss)


@contextmanager
def started(kind: str, cmd: list[str], port: int,
            env: dict[str, str] | None = None) -> Iterator[Server]:
    """Start a server in its own session (``procs.popen``: it dies with the bench), wait for a
    200 on ``/health`` (the start-up time), and stop its whole process group afterwards."""
    t0 = time.perf_counter()
    proc = procs.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        yield Server(kind, url, proc.pid, wait_health(url, proc, t0))
    finally:
        procs.stop(proc)


def serving_rows(servers: list[tuple[str, list[str], int, dict[str, str] | None]],
                 closed: Workload, streams: int, rated: list[tuple[float, Workload]],
                 report) -> None:
    """Start each server (one after the other, so start-up times are not contended), then run
    the closed loop and every rate, alternating which server goes first; ``report(kind,
    metric, value, unit)`` gets every figure."""
    with procs.guarded(), ExitStack() as stack:
        up: list[Server] = []
        for kind, cmd, port, env in servers:
            up.append(stack.enter_context(started(kind, cmd, port, env)))
            report(kind, "serve_startup_s", up[-1].startup_s, "s")
        stages: list[tuple[str, float | None, Workload]] = [("serve", None, closed)]
        stages += [(f"serve_{rate:g}rps", rate, work) for rate, work in rated]
        for i, (prefix, rate, work) in enumerate(stages):
            for server in (up if i % 2 == 0 else up[::-1]):
                recs, wall = asyncio.run(_drive(server, work, streams, rate))
                for metric, value, unit in summary(recs, wall, server.url):
                    report(server.kind, f"{prefix}_{metric}", value, unit)
                server.sample_memory()
                if i == 0:  # under the 8-stream load (llama-server's prompt cache grows later)
                    report(server.kind, "serve_rss_mb", server.rss_mb, "MB")
                    if server.pss_mb is not None:
                        report(server.kind, "serve_pss_mb", server.pss_mb, "MB")
        for server in up:
            report(server.kind, "serve_rss_max_mb", server.rss_mb, "MB")
            if server.pss_mb is not None:
                report(server.kind, "serve_pss_max_mb", server.pss_mb, "MB")


async def _drive(server: Server, work: Workload, streams: int,
                 rate: float | None) -> tuple[list[RequestRecord], float]:
    """Every request of ``work``: at most ``streams`` at once (``rate`` None), or each sent at
    its Poisson arrival time whatever is in flight. Samples the server's memory mid-load."""
    from aioengine.bench.http_driver import HTTPDriver
    from aioengine.bench.workload import poisson_arrivals

    sem = asyncio.Semaphore(streams if rate is None else len(work))
    arrivals = poisson_arrivals(len(work), rate, 11) if rate else [0.0] * len(work)
    async with HTTPDriver(server.url) as http:
        if rate is None:
            await http.one(work.prompts[0][:8], 4)  # warm-up
        t0 = time.perf_counter()

        async def one(i: int) -> RequestRecord:
            await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
            async with sem:
                rec = await http.one(work.prompts[i], work.output_lens[i])
            if i == len(work) // 2:
                server.sample_memory()
            return rec

        recs = await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(len(work)))), RATE_TIMEOUT)
        return list(recs), time.perf_counter() - t0


def summary(recs: list[RequestRecord], wall: float, url: str) -> list[tuple[str, float, str]]:
    """Output tok/s, TTFT and ITL p50/p90 of a stage; a failed request fails the suite (the two
    servers are compared on the same completed work)."""
    bad = [r.error for r in recs if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(recs)} requests to {url} failed: {bad[0]}")
    ttft = [r.ttft * 1000 for r in recs]
    itl = [x * 1000 for r in recs for x in r.itls]
    rows = [("output_tok_s", sum(r.tokens for r in recs) / wall, "tok/s")]
    for q in (50, 90):
        rows.append((f"ttft_p{q}_ms", percentile(ttft, q), "ms"))
        rows.append((f"itl_p{q}_ms", percentile(itl, q), "ms"))
    return rows

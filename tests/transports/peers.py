"""Child-process peers for the transport contract suite. Each runs in a fresh interpreter:

    python -m tests.transports.peers ROLE URL ARG...

A peer prints ``ready [ADDRESS]`` once its endpoint is open, checks what it receives itself,
and reports by exit status (0: every message arrived intact and in order). Nothing is
pickled: arguments are command-line strings, results are exit codes and stdout lines.
"""

from __future__ import annotations

import hashlib
import os
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

import anyio

import transports as T

ROOT = Path(__file__).resolve().parents[2]
SEQ = struct.Struct("<Q")
BAD_DATA = 3


def payload(i: int, size: int) -> bytes:
    """Deterministic, index-dependent bytes (fast even for 64 MiB)."""
    block = hashlib.sha256(str(i).encode()).digest() * 64  # 2 KiB
    reps, rest = divmod(size, len(block))
    return block * reps + block[:rest]


def sizes_for(i: int, size: int) -> int:
    """A message's buffer size: ``size``, or a mix of small ones when size is -1."""
    return (i * 37) % 5000 if size < 0 else size


def make_message(i: int, size: int) -> tuple[bytes, list[bytes]]:
    n = sizes_for(i, size)
    return SEQ.pack(i), [payload(i, n)]


def check_message(msg: T.Message, i: int, size: int) -> bool:
    n = sizes_for(i, size)
    return (bytes(msg.header) == SEQ.pack(i) and len(msg.buffers) == 1
            and msg.buffers[0] == payload(i, n))


# ---- roles --------------------------------------------------------------------------------
ASYNC_MODES = {"async": "asyncio", "trio": "trio"}  # mode -> anyio backend


def writer(url: str, count: int, size: int, mode: str, linger: float) -> int:
    """Bind a writer, announce its address, send ``count`` messages, then idle or close.
    ``mode``: sync, async (asyncio) or trio."""
    if mode in ASYNC_MODES:
        return anyio.run(_async_writer, url, count, size, linger, backend=ASYNC_MODES[mode])
    w = T.open_writer(url)
    print("ready", w.address, flush=True)
    for i in range(count):
        w.send(*make_message(i, size))
    time.sleep(linger)  # a SIGKILL test kills us here
    w.close()
    return 0


async def _async_writer(url: str, count: int, size: int, linger: float) -> int:
    w = await T.open_async_writer(url)
    print("ready", w.address, flush=True)
    for i in range(count):
        await w.send(*make_message(i, size))
    await anyio.sleep(linger)
    w.close()
    return 0


def reader(url: str, count: int, size: int, mode: str, rank: int) -> int:
    """Connect a (broadcast, if rank >= 0) reader, check ``count`` messages, expect the end."""
    if mode in ASYNC_MODES:
        return anyio.run(_async_reader, url, count, size, rank, backend=ASYNC_MODES[mode])
    r = T.open_reader(url) if rank < 0 else T.open_broadcast_reader(url, rank)
    print("ready", flush=True)
    try:
        for i in range(count):
            if not check_message(r.recv(timeout=60), i, size):
                return BAD_DATA
        try:
            r.recv(timeout=60)
        except T.PeerClosedError:
            return 0
        return BAD_DATA  # more messages than sent
    finally:
        r.close()


async def _async_reader(url: str, count: int, size: int, rank: int) -> int:
    r = await (T.open_async_reader(url) if rank < 0 else T.open_async_broadcast_reader(url, rank))
    print("ready", flush=True)
    try:
        for i in range(count):
            if not check_message(await r.recv(timeout=60), i, size):
                return BAD_DATA
        try:
            await r.recv(timeout=60)
        except T.PeerClosedError:
            return 0
        return BAD_DATA
    finally:
        r.close()


# ---- starting peers from a test -------------------------------------------------------------
class Peer:
    """A running peer; ``wait_ready()`` returns what it printed after ``ready``."""

    def __init__(self, *args: object) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.transports.peers", *map(str, args)],
            stdout=subprocess.PIPE, cwd=ROOT, env=env, text=True)

    def wait_ready(self, timeout: float = 60.0) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"peer {self.proc.args} did not start within {timeout} s")
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            raise RuntimeError(f"peer {self.proc.args} failed to start: {line}")
        return " ".join(line[1:])

    def wait(self, timeout: float = 120.0) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def main(argv: list[str]) -> int:
    role, url, *rest = argv
    if role == "writer":
        count, size, mode, linger = int(rest[0]), int(rest[1]), rest[2], float(rest[3])
        return writer(url, count, size, mode, linger)
    if role == "reader":
        count, size, mode, rank = int(rest[0]), int(rest[1]), rest[2], int(rest[3])
        return reader(url, count, size, mode, rank)
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

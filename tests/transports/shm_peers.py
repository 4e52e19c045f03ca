"""Peer programs for the shm tests, each a fresh interpreter (spawned, nothing inherited):

    python -m tests.transports.shm_peers ROLE ARG...

A peer prints ``ready`` once its endpoints are open, reports results over a second shm channel
(never pickle), and exits 0 on success. ``spawn_peer`` starts one from a test.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from transports import PeerClosedError, shm

ROOT = Path(__file__).resolve().parents[2]


def payload(seed: int, i: int, size: int) -> bytes:
    """Deterministic, index-dependent bytes (cheap even for tens of MiB)."""
    block = hashlib.sha256(f"{seed}:{i}".encode()).digest() * 64  # 2 KiB
    reps, rest = divmod(size, len(block))
    return block * reps + block[:rest]


def sizes(seed: int, count: int, max_size: int) -> list[int]:
    """A mix of tiny, odd and large sizes, always including 0 and ``max_size``."""
    out = [0, max_size]
    state = seed or 1
    while len(out) < count:
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append((state >> 20) % (max_size + 1) if state & 1 else (state >> 40) % 64)
    return out[:count]


def digest_of(messages: Sequence[tuple[bytes, list[bytes]]]) -> bytes:
    h = hashlib.sha256()
    for header, buffers in messages:
        h.update(len(header).to_bytes(8, "little") + header)
        h.update(len(buffers).to_bytes(8, "little"))
        for b in buffers:
            h.update(len(b).to_bytes(8, "little") + b)
    return h.digest()


def spawn_peer(*args: object) -> subprocess.Popen[str]:
    """Start a peer and wait for its ``ready`` line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "tests.transports.shm_peers",
                             *map(str, args)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"peer {args} failed to start (exit {proc.returncode}): {line!r}")
    return proc


def _ready() -> None:
    print("ready", flush=True)


def _report(out_url: str, data: bytes) -> None:
    with shm.open_writer(out_url, bind=False, capacity=4096, connect_timeout=30) as w:
        w.send(data, timeout=30)


# ---- roles ---------------------------------------------------------------------------------
def echo(in_url: str, out_url: str) -> None:
    """Send every message back unchanged until the writer goes away."""
    r = shm.open_reader(in_url, connect_timeout=30)
    w = shm.open_writer(out_url, bind=False, capacity=1 << 20, connect_timeout=30)
    _ready()
    with r, w:
        try:
            while True:
                m = r.recv()
                w.send(m.header, m.buffers)
        except PeerClosedError:
            pass


def produce(url: str, seed: str, count: str, max_size: str, capacity: str) -> None:
    """Bind a writer, send ``count`` deterministic messages (header + two buffers), close."""
    seed_, n = int(seed), int(count)
    with shm.open_writer(url, capacity=int(capacity), connect_timeout=30) as w:
        _ready()
        for i, size in enumerate(sizes(seed_, n, int(max_size))):
            w.send(i.to_bytes(4, "little"), [payload(seed_, i, size), b"x" * (i % 3)],
                   timeout=60)


def digest(url: str, rank: str, count: str, out_url: str, delay: str = "0") -> None:
    """Broadcast reader ``rank``: read ``count`` messages (sleeping ``delay`` s after each
    one), then report a digest of what arrived, and how long it took, on ``out_url``."""
    pause = float(delay)
    with shm.open_broadcast_reader(url, int(rank), connect_timeout=30) as r:
        _ready()
        got = []
        start = time.monotonic()
        for _ in range(int(count)):
            m = r.recv(timeout=60)
            got.append((bytes(m.header), [bytes(b) for b in m.buffers]))
            if pause:
                time.sleep(pause)
        took = time.monotonic() - start
    _report(out_url, digest_of(got) + f"{took:.6f}".encode())


def hang_reader(url: str) -> None:
    """Connect a reader, take one message, then stop reading for good: to be killed."""
    with shm.open_reader(url, connect_timeout=30) as r:
        _ready()
        r.recv()
        while True:
            time.sleep(60)


def hang_writer(url: str) -> None:
    """Bind a writer, send one message once the reader is in, then hang: to be killed."""
    with shm.open_writer(url, capacity=1 << 16, connect_timeout=30) as w:
        _ready()
        w.send(b"first", [b"still readable after my death"])
        while True:
            time.sleep(60)


def sink(url: str, count: str) -> None:
    """Read ``count`` messages as fast as possible (for the development benchmark)."""
    with shm.open_reader(url, connect_timeout=30) as r:
        _ready()
        for _ in range(int(count)):
            r.recv()


def idle(url: str) -> None:
    """A reader that gets one message, then waits for a second that comes late (CPU use of
    a reader sleeping on its ring)."""
    with shm.open_reader(url, connect_timeout=30) as r:
        _ready()
        r.recv()
        r.recv()


class Peers:
    """Peers started by one test; ``close()`` kills and reaps whatever is still running."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, *args: object) -> subprocess.Popen[str]:
        proc = spawn_peer(*args)
        self.procs.append(proc)
        return proc

    @staticmethod
    def join(proc: subprocess.Popen[str], timeout: float = 60) -> None:
        """Wait for a peer to finish and insist that it succeeded."""
        code = proc.wait(timeout)
        if code != 0:
            raise AssertionError(f"peer {proc.args[3:]} exited with {code}")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


ROLES: dict[str, Callable[..., None]] = {
    "echo": echo, "produce": produce, "digest": digest, "hang-reader": hang_reader,
    "hang-writer": hang_writer, "sink": sink, "idle": idle,
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](*sys.argv[2:])

"""The server's memory settles after huge requests (issue 17: 123 MB -> 1.8 GB after eight
3.9 MB chat messages, never returned). Measured on a real ``python -m aioengine.serve``
process: a message that cannot fit the context is refused before it is tokenized, and after a
long text is tokenized the tokenizer's freed memory goes back to the system (malloc_trim)
instead of staying in glibc's per-thread arenas."""

from __future__ import annotations

import time

import psutil
import requests

from tests.server.server_process import ServerProcess

HUGE_CHAT = "ab " * 1_300_000  # 3.9 MB: cannot fit a 256-token context
LONG_PROMPT = "ab " * 400_000  # 1.2 MB for /tokenize, which counts any prompt
SETTLE_MB = 100  # RSS may end at most this far above where it was after a warm-up


def _rss_mb(proc: psutil.Process) -> float:
    return proc.memory_info().rss / 1e6


def test_rss_settles_after_huge_requests():
    with ServerProcess("--max-request-bytes", str(16 << 20)) as srv:
        proc = psutil.Process(srv.proc.pid)
        s = requests.Session()
        # Warm-up: one of each (imports, the template, the tokenizer's first allocations).
        warm = s.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert warm.status_code == 200, warm.text
        assert s.post(f"{srv.url}/tokenize", json={"prompt": "hi " * 100_000},
                      timeout=60).status_code == 200
        start = _rss_mb(proc)
        seen = []
        for _ in range(8):
            t0 = time.perf_counter()
            r = s.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": HUGE_CHAT}], "max_tokens": 2})
            took = time.perf_counter() - t0
            assert r.status_code == 400, r.text
            assert "prompt has at least" in r.json()["error"]["message"]
            assert took < 3.0, took  # tokenizing it took 5-9 s (22 s on a busy box)
            seen.append(_rss_mb(proc))
        for _ in range(3):
            r = s.post(f"{srv.url}/tokenize", json={"prompt": LONG_PROMPT}, timeout=120)
            assert r.status_code == 200 and r.json()["count"] > 400_000
            seen.append(_rss_mb(proc))
        # Without the trim the three /tokenize calls alone took it from 89 to 493 MB.
        assert max(seen[-3:]) < start + SETTLE_MB, (start, seen)
        assert max(seen) < start + 2 * SETTLE_MB, (start, seen)
        assert srv.terminate() == 0

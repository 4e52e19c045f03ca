"""Each problem issue 17 found by trying a server from outside, replayed against a real
``python -m aioengine.serve`` process (loopback bind, DEBUG log) with raw HTTP: the fixed
answer, and the server still serving after it. (The huge-message stall and memory are in
test_memory_huge_requests.py, the engine death policies in test_serve_process.py and
test_restart_engine.py.)"""

from __future__ import annotations

import asyncio
import collections
import socket
import time

import aiohttp
import psutil
import pytest
import requests

from tests.server.server_process import ServerProcess

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server():
    with ServerProcess("--log-level", "DEBUG", "--idle-timeout", "1") as srv:
        yield srv
        assert srv.terminate() == 0


def _error(response: requests.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"], error
    return error["message"]


def test_non_utf8_bytes_in_a_json_string_are_400(server):
    body = b'{"messages": [{"role": "user", "content": "a\xff\xfeb"}]}'
    r = requests.post(server.url + CHAT, data=body, timeout=30,
                      headers={"Content-Type": "application/json"})
    message = _error(r, 400, "invalid_json")
    assert "UTF-8" in message or "utf-8" in message, message
    # The refusal is in the DEBUG log: method, route, status and code, never the body. (Written
    # before the answer; the 30 s only guard against a hang of the pipe's reader.)
    deadline = time.monotonic() + 30
    while "refused POST /v1/chat/completions" not in server.output():
        assert time.monotonic() < deadline, server.output()[-2000:]
        time.sleep(0.05)
    assert "\\xff" not in server.output() and "a\ufffdb" not in server.output()


def test_a_post_without_content_type_is_415(server):
    r = requests.post(server.url + CHAT, timeout=30,
                      data=b'{"messages": [{"role": "user", "content": "hi"}]}')
    assert "Content-Type" not in r.request.headers
    _error(r, 415, "unsupported_media_type")


def test_a_foreign_host_header_is_refused_on_loopback(server):
    r = requests.get(server.url + "/v1/models", headers={"Host": "attacker.example"},
                     timeout=30)
    _error(r, 400, "invalid_host")


def test_models_shows_the_served_name_not_a_path(server):
    r = requests.get(server.url + "/v1/models", timeout=30)
    assert r.status_code == 200
    [card] = r.json()["data"]
    assert card["id"] == card["root"] == "tiny" and "/" not in r.text


def test_half_sent_headers_are_closed_by_the_idle_timeout(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        t0 = time.monotonic()
        assert sock.recv(4096) == b""  # closed by the server, not answered
        # --idle-timeout 1 (was held for over 100 s); 30 s leaves a loaded box room
        assert time.monotonic() - t0 < 30
    # ... and it still serves.
    assert requests.get(server.url + "/health", timeout=30).status_code == 200


@pytest.mark.anyio
async def test_two_thousand_requests_at_once_get_503_or_finish_with_memory_bounded():
    """'Over 2,000 requests at once: all accepted, 1,743 waiting, p99 23 s, no 429/503.' With
    --max-queued-requests 8 the excess is refused at once with 503 + Retry-After, the admitted
    ones finish, and the server's memory and open descriptors come back afterwards."""
    with ServerProcess("--max-queued-requests", "8") as srv:
        proc = psutil.Process(srv.proc.pid)
        body = {"prompt": "x", "max_tokens": 8, "ignore_eos": True}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            async def one() -> tuple[int, str | None, float]:
                t0 = time.monotonic()
                async with s.post(srv.url + "/v1/completions", json=body) as r:
                    payload = await r.json()
                    code = payload["error"]["code"] if r.status != 200 else \
                        payload["choices"][0]["finish_reason"]
                    return r.status, code, time.monotonic() - t0

            assert (await one())[:2] == (200, "length")  # warm-up
            rss0, fds0 = proc.memory_info().rss / 1e6, proc.num_fds()
            results = await asyncio.gather(*(one() for _ in range(2000)))
            async with s.get(srv.url + "/metrics") as r:
                metrics = await r.text()
        counts = collections.Counter((status, code) for status, code, _ in results)
        # Every request either finished (200 "length") or was refused at once (503): none
        # failed otherwise. How many were refused depends on how fast the engine's first
        # tokens free queue places while the server works through the 2000 connections (a
        # request stops waiting at its first token), i.e. on the box's load, so the count is
        # not pinned (it was "> 1000", which a slow server loop can miss): some were.
        assert set(counts) == {(200, "length"), (503, "overloaded")}, counts
        assert counts[(200, "length")] >= 8 and counts[(503, "overloaded")] > 0, counts
        refused = sorted(t for status, _, t in results if status == 503)
        admitted = sorted(t for status, _, t in results if status == 200)
        print(f"2000 at once: {counts}; refused p50/p99 {refused[len(refused) // 2]:.2f}/"
              f"{refused[int(len(refused) * 0.99)]:.2f} s; admitted p99 "
              f"{admitted[int(len(admitted) * 0.99)]:.2f} s; rss {rss0:.0f} -> "
              f"{proc.memory_info().rss / 1e6:.0f} MB")
        overloaded = [line for line in metrics.splitlines()
                      if line.startswith("aioengine_requests_total{")
                      and 'outcome="overloaded"' in line]
        assert len(overloaded) == 1, overloaded
        assert float(overloaded[0].rsplit(" ", 1)[1]) == counts[(503, "overloaded")], \
            (overloaded, counts)
        assert proc.memory_info().rss / 1e6 < rss0 + 150
        # the closed connections' sockets go away (a state; 60 s is a hang guard)
        deadline = time.monotonic() + 60
        while proc.num_fds() > fds0 + 5:
            assert time.monotonic() < deadline, (fds0, proc.num_fds())
            await asyncio.sleep(0.1)
        assert srv.terminate() == 0

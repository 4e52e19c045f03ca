"""``--on-engine-death restart``: a real server process whose engine is SIGKILLed starts a new
one in process: the streams of the dead engine end with ``engine_dead``, ``/health`` answers
503 ``engine_restarting`` meanwhile and 200 again after, requests work on the new engine, no
process of the old one is left; after ``--max-engine-restarts`` in a row it exits 1."""

from __future__ import annotations

import json
import signal
import time

import psutil
import requests

from tests.server.server_process import LONG_CONTEXT, LONG_TOKENS, ServerProcess, wait_for


def _engines(srv: ServerProcess) -> list[psutil.Process]:
    children = psutil.Process(srv.proc.pid).children(recursive=True)
    return [p for p in children if p.name().startswith("aioengine-engi")]


def _kill_engine_during_a_stream(srv: ServerProcess, s: requests.Session) -> list[psutil.Process]:
    """SIGKILL the engine while a stream runs; the stream ends with engine_dead + [DONE].
    Returns the processes the engine was made of. The server runs with LONG_CONTEXT: the
    stream (LONG_TOKENS) cannot end on its own before the kill lands."""
    before = [p for p in psutil.Process(srv.proc.pid).children(recursive=True)
              if p.name().startswith("aioengine-")]  # not the resource tracker, kept
    body = {"prompt": "x", "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": True}
    with s.post(srv.url + "/v1/completions", json=body, stream=True, timeout=60) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line).startswith(b"data: {")  # it has begun
        [engine] = _engines(srv)
        engine.kill()
        events = [line.decode() for line in lines if line]
    assert events[-1] == "data: [DONE]", events[-3:]
    assert json.loads(events[-2][len("data: "):])["error"]["code"] == "engine_dead", events[-2]
    return before


def _health(s: requests.Session, url: str) -> tuple[int, str | None]:
    r = s.get(url + "/health", timeout=10)
    return r.status_code, (r.json()["error"]["code"] if r.status_code != 200 else None)


def test_engine_killed_is_restarted_in_process():
    with ServerProcess("--on-engine-death", "restart", *LONG_CONTEXT) as srv:
        s = requests.Session()
        assert _health(s, srv.url) == (200, None)
        old = _kill_engine_during_a_stream(srv, s)
        t0 = time.monotonic()
        seen: list[tuple[int, str | None]] = []

        refused: list[tuple[int, str, str | None]] = []

        def back() -> bool:
            seen.append(_health(s, srv.url))
            if seen[-1] == (503, "engine_restarting") and len(refused) < 3:
                r = s.post(srv.url + "/v1/completions", json={"prompt": "x"}, timeout=30)
                if r.status_code != 200:  # (200: the new engine came up in between)
                    refused.append((r.status_code, r.json()["error"]["code"],
                                    r.headers.get("Retry-After")))
            return seen[-1][0] == 200

        wait_for(back, 120, "/health 200 after the restart")
        took = time.monotonic() - t0
        assert (503, "engine_restarting") in seen, seen  # the 1 s backoff at least
        assert all(h in ((503, "engine_restarting"), (503, "engine_dead")) for h in seen[:-1])
        # The old engine's processes are all gone; the new engine answers.
        _, alive = psutil.wait_procs(old, timeout=10)
        assert not alive, alive
        r = s.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200, r.text
        # Generation requests meanwhile: 503 engine_restarting with Retry-After (engine_dead
        # only in the moment between the death and the restart's start).
        assert refused and all(r in ((503, "engine_restarting", "1"), (503, "engine_dead", None))
                               for r in refused), refused
        assert (503, "engine_restarting", "1") in refused, refused
        metrics = s.get(srv.url + "/metrics", timeout=10).text
        assert 'aioengine_engine_restarts_total{model="tiny"} 1.0' in metrics
        assert 'aioengine_engine_up{model="tiny"} 1.0' in metrics
        assert "restarting it in 1.0 s (restart 1 of at most 5" in srv.output()
        assert "the engine is back" in srv.output()
        srv.descendants = psutil.Process(srv.proc.pid).children(recursive=True)
        assert srv.terminate() == 0, srv.output()
        print(f"restarted in {took:.1f} s")


def test_restarts_in_a_row_are_capped():
    with ServerProcess("--on-engine-death", "restart", "--max-engine-restarts", "1",
                       *LONG_CONTEXT) as srv:
        s = requests.Session()
        _kill_engine_during_a_stream(srv, s)
        wait_for(lambda: _health(s, srv.url)[0] == 200, 120, "the first restart")
        descendants = psutil.Process(srv.proc.pid).children(recursive=True)
        _kill_engine_during_a_stream(srv, s)  # within a minute: the streak is 1 = the cap
        assert srv.proc.wait(60) == 1, srv.output()
        assert "after 1 restart(s) in a row: giving up" in srv.output()
        srv.descendants = descendants
        srv.assert_no_leftovers()


def test_sigterm_while_restarting_stops_cleanly():
    with ServerProcess("--on-engine-death", "restart", *LONG_CONTEXT) as srv:
        s = requests.Session()
        old = _kill_engine_during_a_stream(srv, s)
        wait_for(lambda: _health(s, srv.url) == (503, "engine_restarting"), 60,
                 "the restart to begin")
        # The new engine's process exists (it is named first thing, before its imports and
        # model load): a state, where a sleep past the 1 s backoff guessed it (the backoff
        # starts after the dead engine's shutdown, and a spawn is slow on a loaded box).
        new: list[psutil.Process] = []

        def started() -> bool:
            new[:] = [p for p in _engines(srv) if p not in old]
            return bool(new)

        wait_for(started, 60, "the new engine's process")
        srv.descendants = psutil.Process(srv.proc.pid).children(recursive=True)
        [engine] = new
        # Held mid-start (SIGSTOP) until the server has taken the SIGTERM: the restart cannot
        # finish first, however the box schedules us, so the SIGTERM lands while restarting.
        engine.suspend()
        try:
            assert _health(s, srv.url) == (503, "engine_restarting")
            srv.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: "SIGTERM: stopping" in srv.output(), 60, "the server's SIGTERM")
        finally:
            engine.resume()
        assert srv.wait_stopped() == 0, srv.output()  # asserts none of them is left
        _, alive = psutil.wait_procs(old, timeout=10)
        assert not alive and "server stopped" in srv.output()

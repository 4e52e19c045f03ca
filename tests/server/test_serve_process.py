"""``python -m aioengine.serve`` as a real process: the openai client, SIGTERM mid-stream,
engine death, bad flags, and no torch in the host."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import aiohttp
import openai
import psutil
import pytest

from tests.server.server_process import LONG_CONTEXT, LONG_TOKENS, ROOT, ServerProcess

pytestmark = pytest.mark.anyio


def test_host_process_never_imports_torch():
    code = ("import sys, aioengine.serve, aioengine.server;"
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_the_program_starts_the_engine_before_the_server_imports():
    """``aioengine.server.__main__`` reads its arguments, binds and spawns the engine without
    aiohttp: the server's imports (~0.4 s) run in a thread while the engine starts. The
    package's ``create_app`` is still there, imported on first use."""
    code = ("import sys, aioengine.server.__main__ as m;"
            "assert 'aiohttp' not in sys.modules, 'aiohttp imported';"
            "web, create_app = m._server_imports();"
            "import aioengine.server as s;"
            "assert s.create_app is create_app and 'aiohttp' in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


def test_bad_engine_flag_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "aioengine.serve", "--max-num-seqs", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "max_num_seqs must be a positive integer, got 0" in r.stderr


def test_start_up_failures_exit_1_with_their_own_cause(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    env = {**os.environ, "AIOENGINE_CACHE": str(not_a_dir)}
    r = subprocess.run([sys.executable, "-m", "aioengine.serve", "--port", "0"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "the engine failed to start" in r.stderr and "AIOENGINE_CACHE" in r.stderr, r.stderr
    assert "cannot serve on" not in r.stderr, r.stderr  # not blamed on the address
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "aioengine.serve", "--port", str(port),
                            "--max-model-len", "256", "--num-kv-blocks", "64"], cwd=ROOT,
                           capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stderr
    assert f"cannot serve on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "address already in use" in r.stderr.lower(), r.stderr


@pytest.mark.parametrize("host", ["127.0.0.1", "no-such-host.invalid"])
def test_an_address_it_cannot_serve_fails_fast_and_starts_no_process(host):
    """The socket is bound before the engine starts: one log line, exit 1, and no child (the
    server is watched for children the whole time it runs)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "aioengine.serve", "--host", host,
                                 "--port", str(port), "--max-model-len", "256",
                                 "--num-kv-blocks", "64"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        children: set[int] = set()
        try:
            watched = psutil.Process(proc.pid)
            while proc.poll() is None:
                try:
                    children.update(c.pid for c in watched.children(recursive=True))
                except psutil.NoSuchProcess:
                    break
                if children:
                    break
                time.sleep(0.01)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            for pid in children:
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).kill()
    assert not children, f"the server started processes before binding: {children}"
    assert proc.returncode == 1, err
    (line,) = err.strip().splitlines()  # one line, no traceback
    assert f"ERROR aioengine.serve: cannot serve on {host}:{port}: " in line, err
    if host == "127.0.0.1":
        assert line.endswith("Address already in use"), line


async def test_openai_client_then_sigterm_mid_stream():
    # Grace 0: the stream in flight is aborted at once, and still ends properly. The stream
    # cannot end on its own before the SIGTERM is handled (LONG_CONTEXT, LONG_TOKENS).
    with ServerProcess("--grace-period", "0", *LONG_CONTEXT) as srv:
        oai = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        try:
            r = await oai.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
            assert r.usage.completion_tokens >= 1
            stream = await oai.completions.create(
                model="tiny", prompt="go", max_tokens=LONG_TOKENS, stream=True,
                extra_body={"ignore_eos": True})
            first = await stream.__anext__()
            assert first.choices
            rc = await asyncio.to_thread(srv.terminate, 60.0)
            # Not cut: the rest of the stream arrives, ending in finish_reason "abort" (the
            # openai client raises if the connection closes before data: [DONE]).
            rest = [chunk async for chunk in stream]
            assert rest[-1].choices[0].finish_reason == "abort"
            assert 1 + len(rest) <= LONG_TOKENS
        finally:
            await oai.close()
        assert rc == 0, srv.output()
        assert "server stopped" in srv.output()
        assert "still running after the 0.0 s grace period" in srv.output()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as s, s.get(srv.url + "/health"):
                pass


async def test_engine_death_exits_1_after_ending_the_streams():
    """The default policy: streams in flight end with an error event, the server exits 1 for
    its supervisor to restart it, and leaves no process behind."""
    with ServerProcess(*LONG_CONTEXT) as srv:  # the stream cannot end before the kill lands
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "x", "max_tokens": LONG_TOKENS, "ignore_eos": True,
                    "stream": True}
            stream = await s.post(srv.url + "/v1/completions", json=body)
            await stream.content.readuntil(b"\n\n")  # streaming has begun
            for child in srv.descendants:
                child.kill()
            rest = (await stream.read()).decode().split("\n\n")
            assert rest[-2:] == ["data: [DONE]", ""], rest[-3:]
            assert json.loads(rest[-3][len("data: "):])["error"]["code"] == "engine_dead"
        rc = await asyncio.to_thread(srv.proc.wait, 60)
        assert rc == 1, srv.output()
        assert "so that a supervisor restarts the server" in srv.output()
        srv.assert_no_leftovers()


async def test_engine_death_turns_health_to_503_with_keep():
    with ServerProcess("--on-engine-death", "keep", *LONG_CONTEXT) as srv:
        async with aiohttp.ClientSession() as s:
            async with s.get(srv.url + "/health") as resp:
                assert resp.status == 200
            body = {"prompt": "x", "max_tokens": LONG_TOKENS, "ignore_eos": True,
                    "stream": True}
            stream = await s.post(srv.url + "/v1/completions", json=body)
            await stream.content.readuntil(b"\n\n")  # streaming has begun
            for child in srv.descendants:
                child.kill()
            psutil.wait_procs(srv.descendants, timeout=10)
            # The open stream ends with an error event, then [DONE].
            rest = (await stream.read()).decode().split("\n\n")
            assert rest[-2:] == ["data: [DONE]", ""], rest[-3:]
            error = json.loads(rest[-3][len("data: "):])["error"]
            assert error["code"] == "engine_dead", error
            deadline = time.monotonic() + 60  # a wait for the state; a hang guard only
            while True:
                async with s.get(srv.url + "/health") as resp:
                    if resp.status == 503:
                        err = (await resp.json())["error"]
                        assert err["code"] == "engine_dead" and "dead" in err["message"]
                        break
                assert time.monotonic() < deadline, \
                    "/health stayed 200 after the engine was killed"
                await asyncio.sleep(0.05)
            async with s.post(srv.url + "/v1/completions", json={"prompt": "x"}) as resp:
                assert resp.status == 503
                assert (await resp.json())["error"]["code"] == "engine_dead"
            async with s.get(srv.url + "/metrics") as resp:
                assert "aioengine_engine_up{model=\"tiny\"} 0.0" in await resp.text()
        assert await asyncio.to_thread(srv.terminate) == 0, srv.output()


async def test_worker_death_error_is_one_line_without_the_engine_traceback():
    with ServerProcess("--executor", "mp", "--on-engine-death", "keep", *LONG_CONTEXT) as srv:
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "x", "max_tokens": LONG_TOKENS, "ignore_eos": True,
                    "stream": True}
            stream = await s.post(srv.url + "/v1/completions", json=body)
            await stream.content.readuntil(b"\n\n")  # streaming has begun
            workers = [p for p in srv.descendants if p.name().startswith("aioengine-worke")]
            assert len(workers) == 1, srv.descendants
            workers[0].kill()
            rest = (await stream.read()).decode().split("\n\n")
            assert rest[-2:] == ["data: [DONE]", ""], rest[-3:]
            error = json.loads(rest[-3][len("data: "):])["error"]
            assert error["code"] == "engine_dead", error
            assert "worker aioengine-worker-tp0 died" in error["message"], error
            assert "\n" not in error["message"] and "Traceback" not in error["message"], error
            async with s.post(srv.url + "/v1/completions", json={"prompt": "x"}) as resp:
                assert resp.status == 503
                message = (await resp.json())["error"]["message"]
                assert "\n" not in message and "died" in message, message
        assert await asyncio.to_thread(srv.terminate) == 0, srv.output()
        assert "Traceback" in srv.output()  # the detail is in the server's log

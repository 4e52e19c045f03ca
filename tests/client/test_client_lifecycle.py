"""The client's lifecycle from a user's side: Ctrl-C in blocking calls aborts the requests in
the engine, a dropped client is collected and stops its engine, a client refuses other event
loops clearly, bytes are not prompts, and a shut-down client cannot be restarted."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import psutil
import pytest

from aioengine import LLM, AsyncMPClient, EngineStats, SamplingParams, SyncMPClient
from tests.client.conftest import tiny_config
from tests.client.run_on import BACKENDS

# Longer than any test waits: these requests only end by an interrupt or an abort.
LONG = SamplingParams(max_tokens=480, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    with LLM(tiny_config("shm")) as llm:
        yield llm


def settle(client: SyncMPClient, timeout: float = 60.0) -> EngineStats:
    """Stats once nothing runs or waits (aborts travel asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = client.get_stats()
        if (stats.num_running, stats.num_waiting) == (0, 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def interrupt_when_running(client: SyncMPClient, n: int, call: Callable[[], Any]) -> float:
    """Run ``call`` in this (the main) thread and send this process SIGINT once the engine runs
    ``n`` requests, as Ctrl-C in a terminal or a notebook's interrupt does. Returns the seconds
    from the signal to the ``KeyboardInterrupt`` here. The handler raises only while ``call``
    runs, so a late signal cannot interrupt pytest itself."""
    armed = threading.Event()
    sent: list[float] = []

    def on_sigint(signum: int, frame: object) -> None:
        if armed.is_set():
            armed.clear()
            raise KeyboardInterrupt

    def fire() -> None:
        deadline = time.monotonic() + 60
        while armed.is_set() and time.monotonic() < deadline:
            if client.get_stats().num_running >= n:
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.02)

    previous = signal.signal(signal.SIGINT, on_sigint)
    armed.set()
    firer = threading.Thread(target=fire)
    firer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        armed.clear()
        firer.join()
        signal.signal(signal.SIGINT, previous)
    assert sent, "the requests never ran"
    return time.monotonic() - sent[0]


def test_ctrl_c_in_llm_generate_aborts_the_batch(llm: LLM) -> None:
    client = llm.client
    assert isinstance(client, SyncMPClient)
    before = settle(client)
    interrupt_when_running(client, 8, lambda: llm.generate(["x"] * 8, LONG, use_tqdm=False))
    after = settle(client)
    assert (after.num_running, after.num_waiting) == (0, 0)
    assert after.kv_blocks_used == before.kv_blocks_used
    # The engine stopped them early, not after 480 tokens each.
    assert after.generation_tokens_total - before.generation_tokens_total < 8 * 480
    # Still usable.
    out = llm.generate(["after the interrupt"], SHORT, use_tqdm=False)[0]
    assert out.finished and len(out.token_ids) == 4


def test_ctrl_c_in_sync_stream_raises_keyboard_interrupt_and_aborts(llm: LLM) -> None:
    client = llm.client
    assert isinstance(client, SyncMPClient)
    ctrl_c_in_stream(client)


def test_ctrl_c_in_sync_stream_on_a_trio_loop() -> None:
    """The same with the client's own loop under trio (``SyncMPClient(backend="trio")``)."""
    with SyncMPClient(tiny_config("shm"), backend="trio") as client:
        ctrl_c_in_stream(client)


def ctrl_c_in_stream(client: SyncMPClient) -> None:
    before = settle(client)

    def consume() -> None:
        for _ in client.stream("x", LONG):
            pass

    # KeyboardInterrupt itself, not "aclose(): asynchronous generator is already running".
    interrupt_when_running(client, 1, consume)
    after = settle(client)
    assert (after.num_running, after.num_waiting) == (0, 0)
    assert after.kv_blocks_used == before.kv_blocks_used
    assert after.generation_tokens_total - before.generation_tokens_total < 480  # cut short
    assert [o.finished for o in client.stream("again", SHORT)][-1]


def test_bytes_are_not_prompts(llm: LLM) -> None:
    client = llm.client
    assert isinstance(client, SyncMPClient)
    before = settle(client).prompt_tokens_total
    for prompt in (b"hi", bytearray(b"hi"), memoryview(b"hi")):
        with pytest.raises(TypeError, match="got " + type(prompt).__name__):
            llm.generate(prompt, SHORT, use_tqdm=False)  # type: ignore[arg-type]
    # Also a ValueError, like every other bad input; inside a batch and in the async client too.
    with pytest.raises(ValueError, match="got bytes"):
        llm.generate(["ok", b"hi"], SHORT, use_tqdm=False)  # type: ignore[list-item]

    async def async_bytes() -> None:
        async for _ in client.async_client.generate(b"hi", SHORT):  # type: ignore[arg-type]
            pass

    with pytest.raises(TypeError, match="got bytes"):
        client.call_async(async_bytes)
    assert settle(client).prompt_tokens_total == before  # nothing reached the engine


def test_another_event_loop_is_refused_clearly(llm: LLM) -> None:
    client = llm.client
    assert isinstance(client, SyncMPClient)
    owned = client.async_client  # started on the client's background loop

    async def stream() -> None:
        async for _ in owned.generate("x", SHORT):
            pass

    calls: list[Callable[[], Any]] = [stream, owned.get_stats, lambda: owned.abort("nope"),
                                      owned.shutdown]
    async def bounded(call: Callable[[], Any]) -> None:
        # fail_after: without the check, a stream here is never woken and would hang.
        with anyio.fail_after(10):
            await call()

    for backend in BACKENDS:  # another asyncio loop, or a trio run
        for call in calls:
            with pytest.raises(RuntimeError,
                               match="event loop other than the one it was started"):
                anyio.run(bounded, call, backend=backend)
    assert not owned.is_dead  # the refused shutdown did nothing
    assert [o.finished for o in client.stream("still fine", SHORT)][-1]
    assert settle(client).num_running == 0


def engine_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid):
            return True
        time.sleep(0.05)
    return False


async def tasks_left_after(timeout: float) -> list[str]:
    """The client's tasks still running once they had ``timeout`` s to see their channels
    closed (every task the client starts is named aioengine-*; trio: system tasks)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [t.name for t in anyio.get_running_tasks() if "aioengine" in t.name]
        if not left or time.monotonic() > deadline:
            return left
        await anyio.sleep(0.05)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropped_client_is_collected_and_stops_its_engine(backend: str) -> None:
    async def run() -> tuple[bool, bool, list[str]]:
        client = AsyncMPClient(tiny_config("shm"))
        await client.start()
        async for _ in client.generate("used once", SHORT):
            pass
        pid = client.process_ids["aioengine-engine"]
        ref = weakref.ref(client)
        del client
        gc.collect()
        collected = ref() is None
        if not collected:  # clean up for the leak check, then fail below
            await ref().shutdown()  # type: ignore[union-attr]
        gone = engine_gone(pid, 60)
        return collected, gone, await tasks_left_after(30.0)

    collected, gone, tasks_left = anyio.run(run, backend=backend)
    assert collected, "the dropped client is still referenced"
    assert gone, "the dropped client's engine is still running"
    assert tasks_left == []


@pytest.mark.parametrize(("first", "later"), [("asyncio", "asyncio"), ("trio", "trio"),
                                              ("trio", "asyncio")])
def test_shutdown_from_a_later_loop_then_no_restart(first: str, later: str) -> None:
    """``run(start())`` then ``run(shutdown())``: the first loop (or trio run) is over, so the
    second stops the engine itself; a shut-down client refuses ``start()``."""
    client = AsyncMPClient(tiny_config("shm"))
    anyio.run(client.start, backend=first)
    assert client.backend == first
    pid = client.process_ids["aioengine-engine"]
    with pytest.raises(RuntimeError, match="event loop other than"):
        anyio.run(client.get_stats, backend=later)  # the owning loop is gone: refused, not hung
    anyio.run(client.shutdown, backend=later)
    assert client.is_dead and engine_gone(pid, 10)
    with pytest.raises(RuntimeError, match="was shut down; create a new one"):
        anyio.run(client.start, backend=later)
    anyio.run(client.shutdown, backend=later)  # still idempotent


def test_llm_in_a_trio_program() -> None:
    """``LLM`` (blocking: its client runs on a loop of its own in a thread) called from a trio
    program, directly and from a worker thread; and a ``SyncMPClient`` whose own loop is trio."""
    prompts = ["one", "two"]

    async def main() -> tuple[list[list[int]], list[list[int]], list[int]]:
        with LLM(tiny_config("shm")) as llm:
            direct = [o.token_ids for o in llm.generate(prompts, SHORT, use_tqdm=False)]
            threaded = await anyio.to_thread.run_sync(
                lambda: [o.token_ids for o in llm.generate(prompts, SHORT, use_tqdm=False)])
        with pytest.raises(RuntimeError, match="in a trio program use AsyncMPClient"):
            SyncMPClient(tiny_config("shm"), backend="trio")  # on trio's own thread

        def in_a_thread() -> list[int]:
            with SyncMPClient(tiny_config("shm"), backend="trio") as sync:
                assert sync.async_client.backend == "trio"
                return [o for o in sync.stream("one", SHORT)][-1].token_ids

        streamed = await anyio.to_thread.run_sync(in_a_thread)
        return direct, threaded, streamed

    direct, threaded, streamed = anyio.run(main, backend="trio")
    assert direct == threaded and len(direct[0]) == 4
    assert streamed == direct[0]


def test_sync_client_backend_errors() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        SyncMPClient(tiny_config("shm"), backend="curio")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"use_uvloop=True .* needs backend=.asyncio."):
        SyncMPClient(tiny_config("shm"), backend="trio", use_uvloop=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_host_tokenizer_loads_while_the_engine_starts(backend: str, monkeypatch) -> None:
    """``start()`` loads the host's tokenizer while the engine process imports torch and loads
    the model (it used to load after READY): after the engine is spawned (the load holds the
    GIL and would delay the spawn), before the wait for READY returns; once, and the client
    uses that tokenizer."""
    from aioengine.client.tokenizer import Tokenizer
    from aioengine.runtime import Supervisor

    events: list[str] = []
    loaded: list[Tokenizer] = []
    real_from_dir = Tokenizer.from_dir.__func__
    real_spawn, real_wait = Supervisor.spawn, Supervisor.wait_ready

    def from_dir(cls: type[Tokenizer], path: str) -> Tokenizer:
        events.append("tokenizer")
        loaded.append(real_from_dir(cls, path))
        return loaded[-1]

    def spawn(self: Supervisor, *args: Any, **kw: Any) -> Any:
        events.append("spawn")
        return real_spawn(self, *args, **kw)

    def wait_ready(self: Supervisor, *args: Any, **kw: Any) -> Any:
        try:
            return real_wait(self, *args, **kw)
        finally:
            events.append("ready")

    monkeypatch.setattr(Tokenizer, "from_dir", classmethod(from_dir))
    monkeypatch.setattr(Supervisor, "spawn", spawn)
    monkeypatch.setattr(Supervisor, "wait_ready", wait_ready)

    async def run() -> Tokenizer:
        async with AsyncMPClient(tiny_config("shm")) as client:
            async for _ in client.generate("one", SHORT):
                pass
            return client.tokenizer

    tok = anyio.run(run, backend=backend)
    assert events == ["spawn", "tokenizer", "ready"], events
    assert loaded == [tok]

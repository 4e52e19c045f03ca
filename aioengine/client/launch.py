"""Start the engine's processes for a client: bind the channels, spawn, wait for READY.

The client binds both of its channels (so the host, which survives an engine SIGKILL, owns
their cleanup) and hands the addresses to the engine in ``EngineLaunch``. With
``detokenize_in="process"`` a detokenizer process sits between the two and binds the
engine-facing pair itself.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from aioengine.client.backend_types import Backend
from aioengine.client.tokenizer import Tokenizer
from aioengine.config import EngineConfig
from aioengine.hub import ResolvedModel, resolve_model
from aioengine.messages.launch import (
    DETOK_TARGET,
    ENGINE_TARGET,
    DetokLaunch,
    EngineLaunch,
    engine_channel_capacity,
)
from aioengine.runtime import ChildSpec, EngineDeadError, EngineStartupError, Supervisor
from aioengine.runtime.errors import describe_exitcode
from aioengine.runtime.heap_env import model_process_env
from aioengine.units import format_bytes
from transports import AsyncReader, AsyncWriter, open_async_reader, open_async_writer

logger = logging.getLogger(__name__)

ENGINE_NAME = "aioengine-engine"
DETOK_NAME = "aioengine-detokenizer"


@dataclass(frozen=True)
class EngineReady:
    """The engine's READY payload."""

    num_kv_blocks: int
    max_model_len: int
    block_size: int
    eos_token_id: int | None
    vocab_size: int
    kv_bytes_per_block: int = 0
    """Bytes one KV block takes, over all ranks."""
    kv_sized_by: str = ""
    """What decided the KV cache's size (``need: ...``, ``cap: ...``, ``kv_cache_tokens=...``)."""
    kv_dtype: str = ""
    task: str = "generate"
    """``embed`` for an embedding model (it answers ``embed``, not ``generate``)."""

    def describe_kv_cache(self) -> str:
        """The start-up line: blocks, tokens, bytes, dtype and what decided the size."""
        size = format_bytes(self.num_kv_blocks * self.kv_bytes_per_block)
        return (f"KV cache of {self.num_kv_blocks} blocks = "
                f"{self.num_kv_blocks * self.block_size} tokens (max_model_len "
                f"{self.max_model_len}), {size} in {self.kv_dtype or '?'}; sized by "
                f"{self.kv_sized_by or '?'}")

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> EngineReady:
        try:
            return msgspec.convert(payload, cls)
        except msgspec.ValidationError as e:
            raise EngineStartupError(f"the engine's READY payload is malformed: {e}") from e


class EngineOwner(Protocol):
    """What the client asks of whoever holds the engine's process: a local ``Supervisor`` or,
    for a replica on Ray, the handle of its actor."""

    @property
    def names(self) -> list[str]: ...

    def pid(self, name: str) -> int: ...

    def shutdown(self) -> None: ...


class EngineProcess:
    """The running engine as the client sees it: two endpoints and a supervisor."""

    def __init__(self, supervisor: EngineOwner, requests: AsyncWriter, outputs: AsyncReader,
                 ready: EngineReady, resolved: ResolvedModel,
                 tokenizer: Tokenizer | None = None) -> None:
        self.supervisor = supervisor
        self.requests = requests
        self.outputs = outputs
        self.ready = ready
        self.resolved = resolved
        self.tokenizer = tokenizer  # the host's, loaded while the engine started (or None)

    @property
    def tokenizer_path(self) -> str:
        return self.resolved.tokenizer_path

    async def close(self, backend: Backend) -> None:
        """Close our channels first (the engine sees its peer go and leaves its loop at once),
        then stop the processes (``stop_surely``: it joins them)."""
        close_quietly(self.requests, self.outputs)
        await stop_surely(backend, self.supervisor.shutdown)

    def close_sync(self) -> None:
        """For a ``weakref.finalize`` when the owner forgot to shut down."""
        self.supervisor.shutdown()
        close_quietly(self.requests, self.outputs)


def close_quietly(*endpoints: Any) -> None:
    for ep in endpoints:
        if ep is None:
            continue
        try:
            ep.close()
        except Exception:
            logger.exception("closing %r failed", ep)


async def stop_surely(backend: Backend, stop: Callable[[], None]) -> None:
    """Run the blocking ``stop`` in a thread of its own and wait for it. Cancelling the wait
    cannot keep it from running: a cancelled ``to_thread`` whose job is still queued in the
    loop's executor never runs it, and under an anyio cancel scope (a blocking client's
    interrupted start) every await of the cleanup is cancelled again. Were the engine's stop
    lost so, the loop's close would wait for ``wait_ready`` until the start-up timeout."""
    thread = threading.Thread(target=stop, name="aioengine-stop")
    thread.start()  # not a daemon: the interpreter's exit waits for the children to stop
    with backend.shielded():
        await backend.to_thread(thread.join)


def channel_urls(transport: str) -> tuple[str, str]:
    """The two channel URLs for one ``EngineConfig.transport``. A short name gives each its own
    private address; a URL names the request channel, and the output channel gets the same with
    ``-out`` appended (``tcp`` URLs: the next port, unless the port is 0)."""
    if "://" not in transport:
        return transport, transport
    if transport.startswith("zmq+tcp://"):
        host, _, port = transport[len("zmq+tcp://"):].rpartition(":")
        if port.isdigit() and int(port) != 0:
            return transport, f"zmq+tcp://{host}:{int(port) + 1}"
        return transport, transport
    return transport, transport + "-out"


async def launch_engine(config: EngineConfig, on_death: Callable[[EngineDeadError], None],
                        backend: Backend, load_tokenizer: bool = True) -> EngineProcess:
    """Everything ``AsyncMPClient.start`` needs; on failure nothing is left running or bound.
    Blocking steps run in ``backend``'s worker threads. With ``load_tokenizer`` the host's
    tokenizer is loaded while the engine starts (``EngineProcess.tokenizer``)."""
    to_thread = backend.to_thread
    try:
        resolved = await to_thread(functools.partial(resolve_model, require_tokenizer=True),
                                   config.model, config.tokenizer)
    except (FileNotFoundError, ValueError) as e:
        raise EngineStartupError(f"cannot start an engine for model {config.model!r}: {e}") \
            from e

    def death(name: str, exitcode: int | None) -> None:
        on_death(EngineDeadError(f"{name} died ({describe_exitcode(exitcode)})",
                                 process=name, exitcode=exitcode))

    req_url, out_url = channel_urls(config.transport)
    requests: AsyncWriter | None = None
    outputs: AsyncReader | None = None
    supervisor = Supervisor(death)
    try:
        requests = await open_async_writer(req_url, bind=True,
                                           capacity=engine_channel_capacity(req_url))
        outputs = await open_async_reader(out_url, bind=True)
        engine_in, engine_out = requests.address, outputs.address
        if config.detokenize_in == "process":
            detok = DetokLaunch(resolved.tokenizer_path, requests.address, outputs.address,
                                req_url)
            payload = await to_thread(
                supervisor.start, [ChildSpec(DETOK_NAME, DETOK_TARGET,
                                             msgspec.msgpack.encode(detok))],
                config.startup_timeout)
            engine_in = payload[DETOK_NAME]["request_url"]
            engine_out = payload[DETOK_NAME]["output_url"]
        launch = EngineLaunch(config.to_msgpack(), engine_in, engine_out)
        spec = ChildSpec(ENGINE_NAME, ENGINE_TARGET, launch.encode(), env=model_process_env(
            config.cpu_kernels.huge_pages))
        await to_thread(supervisor.spawn, spec)
        # The host's tokenizer loads while the engine imports torch and loads the model (it
        # used to load after READY, adding to start-up), after the spawn (the load holds the
        # GIL); both are waited for, the engine first.
        payload, tokenizer = await backend.gather(
            to_thread(supervisor.wait_ready, config.startup_timeout, [ENGINE_NAME]),
            _tokenizer(backend, resolved.tokenizer_path if load_tokenizer else None),
            return_exceptions=True)
        for outcome in (payload, tokenizer):
            if isinstance(outcome, BaseException):
                raise outcome
        ready = EngineReady.from_payload(payload[ENGINE_NAME])
        logger.info("engine ready: %s", ready.describe_kv_cache())
    except BaseException:
        await stop_surely(backend, supervisor.shutdown)  # a cancelled start too
        close_quietly(requests, outputs)
        raise
    return EngineProcess(supervisor, requests, outputs, ready, resolved, tokenizer)


async def _tokenizer(backend: Backend, path: str | None) -> Tokenizer | None:
    return None if path is None else await backend.to_thread(Tokenizer.from_dir, path)

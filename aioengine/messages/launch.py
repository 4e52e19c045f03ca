"""The launch contracts: what the parent starts each child process with. A target is the
``module:factory`` the runtime imports in the child; the factory decodes the struct below from
msgpack bytes (never pickled). The parent needs only this module, never the child's own (which
imports torch)."""

from __future__ import annotations

import msgspec

from aioengine.config import EngineConfig

ENGINE_TARGET = "aioengine.engine.core_proc:make_engine_target"
WORKER_TARGET = "aioengine.worker.worker_proc:make_worker_target"
DETOK_TARGET = "aioengine.client.detok_proc:make_detokenizer"

ENGINE_RING_BYTES = 2 * 1024 * 1024
"""The ring of each host <-> engine channel on ``shm``. They carry token ids and per-step
outputs (kilobytes a message); the transport's 16 MiB default ring is pre-faulted in both
processes, so the two channels held 64 MB of the serving tree's RSS (32 MB of PSS). 2 MiB still
takes any message up to 1 MiB (a ~250k-token prompt) as one zero-copy record; larger ones
stream through in chunks."""


def engine_channel_capacity(url: str) -> int | None:
    """The capacity to open a host <-> engine channel's writer with: ``ENGINE_RING_BYTES`` on
    ``shm``, the transport's own default (None) on the others, whose capacity means buffering
    rather than memory held."""
    return ENGINE_RING_BYTES if url == "shm" or url.startswith("shm://") else None


class EngineLaunch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the engine process needs; crosses spawn as msgpack."""

    config: bytes  # EngineConfig.to_msgpack()
    input_url: str  # the client's request writer (bound by the client); we connect a reader
    output_url: str  # the client's output reader (bound by the client); we connect a writer
    connect_timeout: float = 30.0

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)


class WorkerLaunch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything one worker needs; crosses ``spawn`` as msgpack (never pickled)."""

    config: EngineConfig
    rank: int
    world_size: int
    step_url: str  # the engine's broadcast writer (bound by the engine); we connect rank ``rank``
    result_url: str  # this rank's result reader (bound by the engine); we connect a writer
    dist_init_addr: str | None = None  # host:port of the torch.distributed rendezvous (tp > 1)
    num_kv_blocks: int | None = None  # None: plan from the config, minimum over ranks
    connect_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.world_size != self.config.tensor_parallel_size:
            raise ValueError(f"world_size {self.world_size} differs from the config's "
                             f"tensor_parallel_size {self.config.tensor_parallel_size}")
        if self.world_size > 1 and not self.dist_init_addr:
            raise ValueError("dist_init_addr (host:port) is required when world_size > 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)


class DetokLaunch(msgspec.Struct, frozen=True):
    tokenizer_path: str
    host_requests_url: str  # the host's writer; we connect a reader
    host_outputs_url: str  # the host's reader; we connect a writer
    engine_transport: str  # scheme or URL to bind the engine-facing channels on
    connect_timeout: float = 30.0

"""Starting the client's replicas: every engine at once, locally or on Ray; on any failure
none is left running."""

from __future__ import annotations

from aioengine.client.asyncio_backend import AsyncioBackend
from aioengine.client.backend_types import Backend
from aioengine.client.dp.replicas import Replica, replica_config
from aioengine.client.launch import EngineProcess, launch_engine
from aioengine.config import EngineConfig
from aioengine.runtime.errors import EngineStartupError


async def launch_replicas(config: EngineConfig, replicas: list[Replica],
                          backend: Backend) -> list[EngineProcess]:
    """Start every replica's engine at once; on any failure none is left running."""
    if config.distributed_backend == "ray":
        if not isinstance(backend, AsyncioBackend):
            raise EngineStartupError(
                f"distributed_backend='ray' needs an asyncio event loop (Ray's handles are "
                f"awaited on asyncio), not {backend.name}; use distributed_backend='mp' "
                f"under {backend.name}")
        from aioengine.client.dp.ray_replicas import launch_ray_replicas
        return await launch_ray_replicas(config, replicas, backend)
    results = await backend.gather(
        *(launch_engine(replica_config(config, r.index), r.death.from_monitor_thread, backend,
                        load_tokenizer=r.index == 0)  # one host tokenizer serves every replica
          for r in replicas), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    started = [r for r in results if isinstance(r, EngineProcess)]
    if failures:
        with backend.shielded():
            await backend.gather(*(e.close(backend) for e in started), return_exceptions=True)
        raise failures[0]
    for replica, engine in zip(replicas, started, strict=True):
        replica.engine = engine
    return started

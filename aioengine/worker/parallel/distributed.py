"""torch.distributed set-up for tensor parallelism, and the two collectives the layers use.

With ``tp_size == 1`` none of this is touched: the collectives return their input unchanged.
"""

from __future__ import annotations

import logging
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from aioengine.worker.parallel.state import TPInfo

logger = logging.getLogger(__name__)


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it).

    There is a small window in which another program can take it; the rendezvous then fails
    with a clear "address in use" error and the engine can retry with a new port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def default_init_addr() -> str:
    """``127.0.0.1:<free port>``: rendezvous for ranks on this host.

    Across hosts, pass a ``host:port`` that every rank can reach instead (the address of rank
    0's machine and a port open there), e.g. ``EngineConfig(dist_init_addr="10.0.0.5:29500")``.
    """
    return f"127.0.0.1:{find_free_port()}"


def _parse_addr(init_addr: str) -> tuple[str, int]:
    host, sep, port = init_addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"init_addr must be 'host:port', got {init_addr!r}")
    return host, int(port)


def init_distributed(rank: int, world_size: int, init_addr: str, backend: str | None = None,
                     timeout_s: float = 120.0) -> TPInfo:
    """Join the tensor-parallel group (blocks until all ``world_size`` ranks have joined).

    ``backend``: ``gloo`` (CPU) or ``nccl`` (CUDA); None picks nccl when CUDA is available.
    Rank 0 hosts the TCP rendezvous at ``init_addr``; see :func:`default_init_addr`.
    """
    TPInfo(rank, world_size)  # validates rank/size
    host, port = _parse_addr(init_addr)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process")
    logger.info("rank %d/%d joining %s group at %s:%d", rank, world_size, backend, host, port)
    dist.init_process_group(backend=backend, init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))
    return TPInfo(rank, world_size)


def destroy_distributed() -> None:
    """Leave the group (no-op when torch.distributed was never initialized)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def check_distributed(tp: TPInfo) -> None:
    """Layers built for ``tp.size > 1`` need the group up, with the same size."""
    if tp.size == 1:
        return
    if not dist.is_initialized():
        raise RuntimeError(f"tensor_parallel_size={tp.size} needs torch.distributed: call "
                           "aioengine.worker.parallel.init_distributed() first")
    if dist.get_world_size() != tp.size or dist.get_rank() != tp.rank:
        raise RuntimeError(f"torch.distributed has rank {dist.get_rank()} of "
                           f"{dist.get_world_size()}, but the model was built for rank "
                           f"{tp.rank} of {tp.size}")


def all_reduce(tensor: torch.Tensor, tp: TPInfo) -> torch.Tensor:
    """Sum over ranks, in place; identity for one rank."""
    if tp.size == 1:
        return tensor
    dist.all_reduce(tensor)
    return tensor


def all_gather(tensor: torch.Tensor, tp: TPInfo, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along ``dim``; identity for one rank."""
    if tp.size == 1:
        return tensor
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(tp.size)]
    dist.all_gather(parts, tensor)
    return torch.cat(parts, dim=dim)

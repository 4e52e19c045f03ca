"""Tensor parallelism: rank info, torch.distributed set-up, parallel linears and embeddings."""

from aioengine.worker.parallel.distributed import (
    all_gather,
    all_reduce,
    default_init_addr,
    destroy_distributed,
    find_free_port,
    init_distributed,
)
from aioengine.worker.parallel.embedding import ParallelLMHead, VocabParallelEmbedding
from aioengine.worker.parallel.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from aioengine.worker.parallel.state import TPInfo, divide

__all__ = [
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RowParallelLinear",
    "TPInfo",
    "VocabParallelEmbedding",
    "all_gather",
    "all_reduce",
    "default_init_addr",
    "destroy_distributed",
    "divide",
    "find_free_port",
    "init_distributed",
]

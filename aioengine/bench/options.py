"""What every suite gets from the command line."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from aioengine.config import Quantization


@dataclass(frozen=True)
class BenchOptions:
    """The options of one bench run; each field is a flag of ``python -m aioengine.bench``
    (its help is the docstring below)."""

    quick: bool = False
    """Small sizes: seconds per suite, not minutes (what ``make bench`` runs)."""
    model: str = "tiny"
    """tiny, a preset name (smollm2-135m-instruct: real weights), a GGUF file or a local model
    directory; with --endpoint, its tokenizer must match the server's model."""
    only: tuple[str, ...] = ()
    """Comma-separated names to restrict a suite to (transports, baselines, ...), e.g.
    uds,mp_queue."""
    progress: bool = True
    """Progress bars on stderr while suites run."""
    rate: float | None = None
    """serve, peers: one request rate in requests/s instead of the default sweep (serve
    quick: 4)."""
    endpoint: str | None = None
    """serve: an OpenAI-compatible server's base URL (e.g. http://127.0.0.1:8000) instead of
    an in-process AsyncMPClient."""
    threads: int | None = None
    """torch threads per model process (EngineConfig.num_threads), the same for every side:
    engines, workers, the transformers baseline, the bare loop; peers: the one thread count to
    compare at. None: the engine's policy, (CPUs - 1) per rank; peers: 1 and 2."""
    llama_cpp: str | None = None
    """peers: a llama.cpp build directory holding llama-bench and llama-server (or their
    bin/)."""
    build_llama_cpp: bool = False
    """peers: build llama.cpp from the llama-cpp-python sdist into the aioengine cache first
    when no build is there (minutes)."""
    quantization: Quantization | None = None
    """peers: our engine keeps weights quantized (EngineConfig.quantization, e.g. gguf: the
    file's own blocks) instead of dequantizing them at load."""
    quants: tuple[str, ...] = ()
    """peers: the file types to compare on, e.g. f32,q8_0,q4_1,q4_k_m: the --model file where
    it is that type, the others made from it once with llama.cpp's llama-quantize (cached next
    to the build). Default: the --model file alone."""
    x8: bool = True
    """peers: our quantized weights in the interleaved x8 layout (the default); --no-x8 keeps
    the file's row layout (``CpuKernelConfig.quant_x8`` off), for A/B."""
    data_parallel_size: int = 1
    """offline, serve: run our engine as N replicas behind one client
    (EngineConfig.data_parallel_size)."""

    def __post_init__(self) -> None:
        if self.rate is not None and not (self.rate > 0 and self.rate != float("inf")):
            raise ValueError(f"--rate must be a positive, finite number of requests per second, "
                             f"got {self.rate}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"--threads must be a positive whole number, got {self.threads}")
        if not isinstance(self.data_parallel_size, int) or self.data_parallel_size < 1:
            raise ValueError("--data-parallel-size must be a positive whole number, got "
                             f"{self.data_parallel_size}")
        if self.quants:
            from aioengine.bench.peers.llama_cpp import parse_quants

            parse_quants(self.quants)  # ValueError naming an unknown type
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError("--endpoint must be an http(s) URL such as "
                                 f"http://127.0.0.1:8000, got {self.endpoint!r}")

    def wants(self, name: str) -> bool:
        return not self.only or name in self.only

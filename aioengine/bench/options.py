"""What every suite gets from the command line."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class BenchOptions:
    quick: bool = False
    model: str = "tiny"
    only: tuple[str, ...] = ()  # restrict a suite to these names (transports, baselines...)
    progress: bool = True
    rate: float | None = None  # serve: one request rate (req/s) instead of the default sweep
    endpoint: str | None = None  # serve: an OpenAI-compatible base URL instead of AsyncMPClient
    threads: int | None = None  # EngineConfig.num_threads for every model process; None: policy
    llama_cpp: str | None = None  # peers: a directory holding llama-bench and llama-server
    build_llama_cpp: bool = False  # peers: build llama.cpp into the cache when none is there
    quantization: str | None = None  # peers: EngineConfig.quantization of our side
    data_parallel_size: int = 1  # offline, serve: engine replicas behind our client

    def __post_init__(self) -> None:
        if self.rate is not None and not (self.rate > 0 and self.rate != float("inf")):
            raise ValueError(f"--rate must be a positive, finite number of requests per second, "
                             f"got {self.rate}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"--threads must be a positive whole number, got {self.threads}")
        if not isinstance(self.data_parallel_size, int) or self.data_parallel_size < 1:
            raise ValueError("--data-parallel-size must be a positive whole number, got "
                             f"{self.data_parallel_size}")
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError("--endpoint must be an http(s) URL such as "
                                 f"http://127.0.0.1:8000, got {self.endpoint!r}")

    def wants(self, name: str) -> bool:
        return not self.only or name in self.only

"""Prometheus metrics of one app, in its own ``CollectorRegistry`` (never the global one, so
two apps in one process do not collide).

Request outcomes and latencies are recorded by the handlers; engine gauges (running, waiting,
KV-cache usage, prefix hit rate) come from ``client.get_stats()`` at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from aioengine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class EngineStatsCollector(Collector):
    """Exposes the last ``EngineStats`` snapshot; ``up`` is 0 once the engine is dead."""

    def __init__(self, model: str) -> None:
        self._model = model
        self.stats: EngineStats | None = None
        self.up = True
        self.restarts = 0  # engines started after the first (--on-engine-death restart)

    def collect(self) -> Iterator[Metric]:
        labels = ["model"]
        values = [self._model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"aioengine_{name}", doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"aioengine_{name}", doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge("engine_up", "1 while the engine answers, 0 once it is dead",
                    1.0 if self.up else 0.0)
        yield counter("engine_restarts", "Engines started in this process after the first one "
                      "died (--on-engine-death restart)", self.restarts)
        s = self.stats
        if s is None:
            return
        yield gauge("num_requests_running", "Requests in the running batch", s.num_running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled", s.num_waiting)
        usage = _usage(s)
        yield gauge("kv_cache_usage_ratio", "Fraction of KV-cache blocks in use", usage)
        yield gauge("kv_cache_blocks_total", "KV-cache blocks in the engine", s.kv_blocks_total)
        yield gauge("kv_cache_bytes_reserved", "Bytes of the KV cache, allocated at start "
                    "(resident on CPU), over all ranks", s.kv_bytes_reserved)
        yield gauge("kv_cache_bytes_used", "Bytes of the KV blocks held by requests",
                    s.kv_bytes_used)
        yield gauge("kv_cache_bytes_prefix_cached", "Bytes of the KV blocks no request holds "
                    "that keep a cached prompt prefix", s.kv_bytes_prefix_cached)
        rss = GaugeMetricFamily("aioengine_process_resident_memory_bytes", "Resident memory "
                                "of each process of the engine's tree (host, engine, workers)",
                                labels=[*labels, "process", "pid"])
        for p in s.processes:
            rss.add_metric([*values, p.role, str(p.pid)], p.rss_bytes)
        yield rss
        yield gauge("prefix_cache_hit_rate", "Fraction of prompt tokens found in the prefix "
                    "cache", s.prefix_cache_hit_rate)
        yield counter("prompt_tokens", "Prompt tokens processed", s.prompt_tokens_total)
        yield counter("generation_tokens", "Tokens generated", s.generation_tokens_total)
        yield counter("num_preemptions", "Requests preempted", s.num_preempted_total)
        yield from self._router_gauges(s)

    def _router_gauges(self, s: EngineStats) -> Iterator[Metric]:
        """The engine gauges under vLLM's names and labels (``model_name``, and ``engine``: the
        replica's index, "0" without data parallelism), which Kubernetes inference gateways
        (the Gateway API inference extension, llm-d) and existing dashboards read to route by
        queue length and KV-cache use. With data-parallel replicas each live replica is its own
        series, as in vLLM; a dead one (``replica_failure="degrade"``) has none."""
        engines = [("0", s)] if s.replicas is None else \
            [(str(i), r) for i, r in enumerate(s.replicas) if r is not None]
        for name, doc, value_of in (
                ("num_requests_running", "Requests in the running batch",
                 lambda e: e.num_running),
                ("num_requests_waiting", "Requests waiting to be scheduled",
                 lambda e: e.num_waiting),
                ("kv_cache_usage_perc", "KV-cache usage, 0 to 1", _usage),
                ("gpu_cache_usage_perc", "KV-cache usage, 0 to 1 (the older name)", _usage)):
            g = GaugeMetricFamily(f"vllm:{name}", doc, labels=["model_name", "engine"])
            for index, e in engines:
                g.add_metric([self._model, index], value_of(e))
            yield g
        if s.replicas is not None:
            up = GaugeMetricFamily("aioengine_replica_up", "1 for each data-parallel replica "
                                   "that serves, 0 for one that died", labels=["model", "replica"])
            for i, r in enumerate(s.replicas):
                up.add_metric([self._model, str(i)], 0.0 if r is None else 1.0)
            yield up


def _usage(s: EngineStats) -> float:
    return s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0


class ServerMetrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "aioengine_requests", "HTTP generation, embedding and rerank requests by endpoint "
            "and outcome (stop, length, abort, error, rejected, disconnected, engine_dead)",
            ["model", "endpoint", "outcome"], registry=self.registry)
        self.ttft = Histogram("aioengine_time_to_first_token_seconds",
                              "Time from request arrival to its first token", ["model"],
                              buckets=_TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("aioengine_inter_token_latency_seconds",
                             "Time between successive tokens of a request", ["model"],
                             buckets=_ITL_BUCKETS, registry=self.registry)
        self.e2e = Histogram("aioengine_e2e_request_latency_seconds",
                             "Time from request arrival to its last token", ["model"],
                             buckets=_E2E_BUCKETS, registry=self.registry)
        self.engine = EngineStatsCollector(model)
        self.registry.register(self.engine)
        self._model = model

    def count(self, endpoint: str, outcome: str) -> None:
        self.requests.labels(self._model, endpoint, outcome).inc()

    def first_token(self, seconds: float) -> None:
        self.ttft.labels(self._model).observe(seconds)

    def inter_token(self, seconds: float) -> None:
        self.itl.labels(self._model).observe(seconds)

    def finished(self, seconds: float) -> None:
        self.e2e.labels(self._model).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)

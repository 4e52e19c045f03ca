"""Per-request latency records of the ``serve`` suite and their summary into ``Result`` rows.

Definitions (vLLM's ``benchmark_serving`` conventions):

- TTFT: from sending the request to the first output token arriving;
- ITL: the gaps between successive arrivals of output after the first (one per arrival: when
  a lagging consumer or server merges tokens, the gap covers all of them);
- TPOT: per request, ``(e2e - ttft) / (tokens - 1)``, for requests with at least 2 tokens;
- E2E: from sending the request to its last output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from aioengine.bench.results import Result

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    sent_s: float  # perf_counter() when sent
    first_s: float | None = None  # ... when the first output token arrived
    done_s: float | None = None  # ... when the last output arrived
    tokens: int = 0  # output tokens, counted from what came back
    itls: list[float] = field(default_factory=list)
    error: str | None = None
    _last_s: float | None = None

    def on_output(self, now: float, tokens_so_far: int) -> None:
        """An arrival carrying output; ``tokens_so_far`` is the cumulative count."""
        if tokens_so_far <= self.tokens:
            return  # nothing new (e.g. a final chunk with only a finish reason)
        if self.first_s is None:
            self.first_s = now
        elif self._last_s is not None:
            self.itls.append(now - self._last_s)
        self._last_s = now
        self.tokens = tokens_so_far

    def finish(self, now: float) -> None:
        self.done_s = now
        if self.error is None and self.tokens == 0:
            self.error = "finished without output tokens"

    @property
    def ok(self) -> bool:
        return self.error is None and self.done_s is not None and self.first_s is not None

    @property
    def ttft(self) -> float:
        assert self.first_s is not None
        return self.first_s - self.sent_s

    @property
    def e2e(self) -> float:
        assert self.done_s is not None
        return self.done_s - self.sent_s

    @property
    def tpot(self) -> float | None:
        if self.tokens < 2:
            return None
        assert self.done_s is not None and self.first_s is not None
        return (self.done_s - self.first_s) / (self.tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``q`` in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(suite: str, name: str, records: Sequence[RequestRecord], wall_s: float,
              offered_rate: float) -> list[Result]:
    """Percentile rows (ms) of TTFT, ITL, TPOT and E2E over the successful requests (each row
    carries its samples, for CDF plots), achieved rates, errors and the offered rate."""
    ok = [r for r in records if r.ok]
    out = [Result(suite, name, "offered_rate", offered_rate, "req/s")]
    series = {
        "ttft": [r.ttft * 1000 for r in ok],
        "itl": [x * 1000 for r in ok for x in r.itls],
        "tpot": [t * 1000 for r in ok if (t := r.tpot) is not None],
        "e2e": [r.e2e * 1000 for r in ok],
    }
    for key, values in series.items():
        if not values:
            continue
        samples = tuple(values)
        for q in PERCENTILES:
            out.append(Result(suite, name, f"{key}_p{q}_ms", percentile(values, q), "ms",
                              samples=samples))
    out.append(Result(suite, name, "achieved_requests_per_s", len(ok) / wall_s, "req/s"))
    out.append(Result(suite, name, "output_tokens_per_s", sum(r.tokens for r in ok) / wall_s,
                      "tok/s"))
    out.append(Result(suite, name, "errors", len(records) - len(ok), "count"))
    return out

"""The serve bench: latency arithmetic, Poisson arrivals, and the suite end to end through
AsyncMPClient and through HTTP against our server (speed is not asserted here)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from aioengine.bench import serve
from aioengine.bench.http_driver import HTTPDriver
from aioengine.bench.latency import RequestRecord, percentile, summarize
from aioengine.bench.options import BenchOptions
from aioengine.bench.workload import poisson_arrivals

ROOT = Path(__file__).resolve().parents[2]
SMALL = serve.Sizes(requests=4, prompt_lens=(8, 16), output_lens=(3, 6), rates=(20.0,),
                    warmup=1)
LATENCY_METRICS = [f"{k}_p{q}_ms" for k in ("ttft", "itl", "tpot", "e2e") for q in (50, 90, 99)]


def test_percentile_interpolates_like_numpy() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 5.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert percentile([7.0], 99) == 7.0
    data = [float(x * x) for x in range(37)]
    assert percentile(data, 25) == pytest.approx(
        statistics.quantiles(data, n=4, method="inclusive")[0])
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_record_measures_ttft_itl_tpot_e2e_from_arrivals() -> None:
    rec = RequestRecord(sent_s=10.0)
    rec.on_output(10.5, 1)  # first token after 0.5 s
    rec.on_output(10.7, 3)  # two merged tokens: one arrival gap
    rec.on_output(10.7, 3)  # nothing new: ignored
    rec.on_output(11.0, 4)
    rec.finish(11.0)
    assert rec.ok and rec.tokens == 4
    assert rec.ttft == pytest.approx(0.5) and rec.e2e == pytest.approx(1.0)
    assert rec.itls == pytest.approx([0.2, 0.3])
    assert rec.tpot == pytest.approx(0.5 / 3)
    empty = RequestRecord(sent_s=0.0)
    empty.finish(1.0)
    assert not empty.ok and empty.error == "finished without output tokens"


def test_summary_counts_errors_and_skips_them_in_latencies() -> None:
    good = RequestRecord(sent_s=0.0)
    good.on_output(0.1, 1)
    good.on_output(0.3, 2)
    good.finish(0.3)
    bad = RequestRecord(sent_s=0.0, error="HTTP 500: boom")
    bad.finish(0.2)
    rows = {r.metric: r for r in summarize("serve", "x", [good, bad], wall_s=2.0,
                                           offered_rate=1.0)}
    assert rows["errors"].value == 1
    assert rows["ttft_p50_ms"].value == pytest.approx(100.0)
    assert rows["ttft_p99_ms"].samples == pytest.approx((100.0,))
    assert rows["e2e_p90_ms"].value == pytest.approx(300.0)
    assert rows["achieved_requests_per_s"].value == pytest.approx(0.5)
    assert rows["output_tokens_per_s"].value == pytest.approx(1.0)


def test_poisson_arrivals_are_seeded_and_at_the_rate() -> None:
    a = poisson_arrivals(2000, 50.0, seed=3)
    assert a == poisson_arrivals(2000, 50.0, seed=3) and a != poisson_arrivals(2000, 50.0, 4)
    assert a[0] == 0.0 and all(x < y for x, y in itertools.pairwise(a))
    assert (len(a) - 1) / a[-1] == pytest.approx(50.0, rel=0.1)
    with pytest.raises(ValueError, match="rate must be positive"):
        poisson_arrivals(3, 0.0, seed=0)


def _check_rows(results: list, name: str) -> dict[str, float]:
    got = {r.metric: r.value for r in results if r.name == name}
    for metric in (*LATENCY_METRICS, "achieved_requests_per_s", "output_tokens_per_s",
                   "errors", "offered_rate"):
        assert metric in got and math.isfinite(got[metric]), metric
    assert got["errors"] == 0
    assert got["offered_rate"] == 20.0
    assert 0 < got["ttft_p50_ms"] <= got["e2e_p50_ms"]
    assert got["ttft_p50_ms"] <= got["ttft_p90_ms"] <= got["ttft_p99_ms"]
    return got


def test_serve_suite_through_the_client() -> None:
    results = serve.run(BenchOptions(progress=False, rate=20.0), SMALL)  # no overload rows
    got = _check_rows(results, "client_20rps")
    assert got["output_tokens_per_s"] > 0 and got["achieved_requests_per_s"] > 0
    ttft = next(r for r in results if r.metric == "ttft_p50_ms")
    assert len(ttft.samples) == SMALL.requests  # one TTFT per request, all succeeded


def test_serve_suite_over_http_against_our_server(serve_url: str) -> None:
    results = serve.run(BenchOptions(progress=False, endpoint=serve_url), SMALL)
    _check_rows(results, "http_20rps")
    tpot = next(r for r in results if r.metric == "tpot_p50_ms")
    assert len(tpot.samples) == SMALL.requests


def test_unreachable_endpoint_is_a_clear_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> None:
        async with HTTPDriver(f"http://127.0.0.1:{port}"):
            pass

    with pytest.raises(RuntimeError, match=f"cannot reach the endpoint http://127.0.0.1:{port}"):
        asyncio.run(go())


@pytest.mark.parametrize(("args", "message"), [
    (["--rate", "0"], "--rate must be a positive, finite number"),
    (["--rate", "inf"], "--rate must be a positive, finite number"),
    (["--endpoint", "ftp://x"], "--endpoint must be an http(s) URL"),
    (["--model", "/nonexistent/model-dir"], "/nonexistent/model-dir"),
    (["--threads", "0"], "--threads must be a positive whole number, got 0"),
    (["--data-parallel-size", "0"], "--data-parallel-size must be a positive whole number"),
])
def test_bad_command_lines_are_refused_with_the_cause(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "aioengine.bench", "serve", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_plots_cdfs_and_rate_curves(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from aioengine.bench.plot import plot_results

    recs = []
    for i in range(5):
        r = RequestRecord(sent_s=0.0)
        r.on_output(0.01 * (i + 1), 1)
        r.on_output(0.05 * (i + 1), 2)
        r.finish(0.05 * (i + 1))
        recs.append(r)
    results = [*summarize("serve", "client_1rps", recs, 1.0, 1.0),
               *summarize("serve", "client_2rps", recs, 0.5, 2.0)]
    paths = plot_results(results, str(tmp_path))
    names = {Path(p).name for p in paths}
    assert {"serve_ttft_cdf.png", "serve_e2e_cdf.png", "serve_throughput_vs_rate.png"} <= names
    assert all(Path(p).stat().st_size > 1000 for p in paths)
    doc_rows = [r.row() for r in results]
    assert json.loads(json.dumps(doc_rows))[0].keys() == {"suite", "name", "metric", "value",
                                                          "unit"}


def test_a_failing_suite_is_reported_and_fails_the_run(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "aioengine.bench", "serve", "--quick", "--no-progress",
         "--endpoint", f"http://127.0.0.1:{port}", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "suite serve failed" in proc.stderr and "cannot reach the endpoint" in proc.stderr
    assert "FAILED: serve" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["results"] == [] and doc["config"]["failed"] == ["serve"]


def test_plot_without_matplotlib_says_how_to_get_it() -> None:
    code = ("import sys; sys.modules['matplotlib'] = None; "
            "from aioengine.bench.__main__ import main; main(['transport', '--plot', 'x'])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert "--plot needs matplotlib" in proc.stderr and "aioengine[plot]" in proc.stderr


def test_wide_tables_put_metrics_in_rows() -> None:
    import io

    from aioengine.bench.results import print_table

    recs = []
    for i in range(3):
        r = RequestRecord(sent_s=0.0)
        r.on_output(0.01 * (i + 1), 1)
        r.on_output(0.02 * (i + 1), 2)
        r.finish(0.02 * (i + 1))
        recs.append(r)
    buf = io.StringIO()
    print_table(summarize("serve", "client_4rps", recs, 1.0, 4.0), None, out=buf)
    lines = buf.getvalue().splitlines()
    assert lines[0].split() == ["metric", "client_4rps"]
    assert any(ln.startswith("ttft_p50_ms [ms]") and ln.split()[-1] == "20" for ln in lines)


def test_overload_rows_compare_admission_control_on_and_off() -> None:
    from aioengine.bench.overload import OverloadSizes, run_overload

    sizes = OverloadSizes(calibrate=8, seconds=1.0, prompt_lens=(8, 16), output_lens=(8, 24))
    results = asyncio.run(run_overload(BenchOptions(progress=False), sizes))
    rows = {(r.name, r.metric): r.value for r in results}
    off_done = rows[("overload_off", "achieved_requests_per_s")]
    assert off_done > 0 and rows[("overload_off", "refused")] == 0
    assert rows[("overload_off", "errors")] == 0
    limit = rows[("overload_on", "max_queued_requests")]
    assert limit >= 2
    # Refused requests are the only errors with the limit on; the rest completed.
    assert rows[("overload_on", "errors")] == rows[("overload_on", "refused")]
    assert rows[("overload_on", "offered_rate")] == rows[("overload_off", "offered_rate")]

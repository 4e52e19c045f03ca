"""The transport bench runs end to end in its smallest form (speed is not asserted here)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from aioengine.bench.results import Result, print_table, write_json

ROOT = Path(__file__).resolve().parents[2]


def test_transport_suite_quick_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "aioengine.bench", "transport", "--quick", "--no-progress",
         "--only", "uds,zmq,mp_pipe,os_pipe,memcpy", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert set(doc) == {"results", "machine", "config"}
    got = {(r["name"], r["metric"]) for r in doc["results"]}
    for name in ("uds", "zmq"):
        for metric in ("rtt_p50_us", "rtt_p99_us", "msgs_per_s_256B", "gbytes_per_s_1MiB",
                       "gbytes_per_s_16MiB", "bcast2_msgs_per_s_256B", "idle_cpu_percent"):
            assert (name, metric) in got
    assert ("os_pipe", "rtt_p50_us") in got and ("memcpy", "gbytes_per_s_16MiB") in got
    assert all(r["value"] >= 0 and r["suite"] == "transport" for r in doc["results"])
    assert "uds" in proc.stdout and "rtt_p50_us" in proc.stdout  # the table was printed


def test_table_shows_factors_where_more_is_always_better(tmp_path: Path) -> None:
    results = [Result("s", "base", "rtt_p50_us", 100.0, "us"),
               Result("s", "fast", "rtt_p50_us", 25.0, "us"),
               Result("s", "base", "msgs_per_s_256B", 1000.0, "msg/s"),
               Result("s", "fast", "msgs_per_s_256B", 3000.0, "msg/s")]
    buf = io.StringIO()
    print_table(results, "base", out=buf)
    text = buf.getvalue()
    assert "25 (4.00x)" in text and "3,000 (3.00x)" in text
    path = tmp_path / "r.json"
    write_json(str(path), results, {"quick": True})
    doc = json.loads(path.read_text())
    assert doc["results"][1] == {"suite": "s", "name": "fast", "metric": "rtt_p50_us",
                                 "value": 25.0, "unit": "us"}
    assert doc["config"] == {"quick": True} and doc["machine"]["cpu_count"]


def test_unknown_suite_is_refused() -> None:
    proc = subprocess.run([sys.executable, "-m", "aioengine.bench", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'nope'" in proc.stderr

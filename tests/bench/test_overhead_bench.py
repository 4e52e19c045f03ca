"""The overhead bench end to end in its smallest form: batch-1 decode through AsyncMPClient
against the bare ModelRunner loop (speed is not asserted here)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from aioengine.bench import overhead
from aioengine.bench.bare_loop import DecodeTiming

ROOT = Path(__file__).resolve().parents[2]


def test_decode_rate_counts_tokens_after_the_first_output() -> None:
    assert DecodeTiming(tokens=11, first_tokens=1, first_token_s=1.0,
                        last_token_s=3.0).decode_tokens_per_s == 5.0
    # A lagging consumer got 3 tokens in its first output: only the 8 after it count.
    assert DecodeTiming(11, 3, 1.0, 3.0).decode_tokens_per_s == 4.0
    with pytest.raises(ValueError, match="needs tokens after the first output"):
        _ = DecodeTiming(1, 1, 1.0, 1.0).decode_tokens_per_s


def test_paired_ratio_is_against_the_mean_of_the_neighbouring_baselines() -> None:
    assert overhead.paired_ratios([90.0, 50.0], [(100.0, 80.0), (40.0, 60.0)]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="2 rates but 1 baseline pairs"):
        overhead.paired_ratios([1.0, 2.0], [(1.0, 1.0)])
    with pytest.raises(ValueError, match="baseline rates must be positive"):
        overhead.paired_ratios([1.0], [(0.0, 1.0)])


def test_rows_cover_every_executor_and_transport() -> None:
    assert overhead.engine_names() == [
        "aioengine_uniproc_zmq", "aioengine_uniproc_shm", "aioengine_uniproc_uds",
        "aioengine_mp_zmq", "aioengine_mp_shm", "aioengine_mp_uds"]


def test_overhead_suite_smallest_form(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "aioengine.bench", "overhead", "--quick", "--no-progress",
         "--only", "bare_loop,aioengine_uniproc_uds,aioengine_mp_shm", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    got = {(r["name"], r["metric"]): r for r in doc["results"]}
    names = ("aioengine_uniproc_uds", "aioengine_mp_shm")
    for name in (*names, "bare_loop"):
        rate = got[(name, "decode_tokens_per_s")]
        assert rate["unit"] == "tok/s" and math.isfinite(rate["value"]) and rate["value"] > 0
    for name in names:
        cpu = got[(name, "host_cpu_ms_per_token")]
        assert cpu["unit"] == "ms" and math.isfinite(cpu["value"]) and cpu["value"] > 0
        paired = got[(name, "vs_bare_paired")]
        assert paired["unit"] == "x" and math.isfinite(paired["value"]) and paired["value"] > 0
    assert ("bare_loop", "host_cpu_ms_per_token") not in got
    assert ("bare_loop", "vs_bare_paired") not in got
    assert {n for n, _ in got} == {*names, "bare_loop"}
    assert doc["config"]["suites"] == ["overhead"] and doc["config"]["quick"] is True
    assert "(factors against bare_loop; > 1 is better)" in proc.stdout

"""The kernels bench runs end to end in its smallest form (speed is not asserted here)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("decode_step_ms_b1", "decode_step_ms_b8", "decode_step_ms_b32",
           "prefill_tokens_per_s", "weight_gbytes_per_s_b1", "mem_bw_fraction_b1")


def test_kernels_suite_quick_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "aioengine.bench", "kernels", "--quick", "--no-progress",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    got = {(r["name"], r["metric"]): r for r in doc["results"]}
    for name in ("aioengine", "hf_transformers"):
        for metric in METRICS:
            value = got[(name, metric)]["value"]
            assert math.isfinite(value) and value > 0, (name, metric, value)
    assert got[("memcpy", "gbytes_per_s")]["unit"] == "GB/s"
    assert all(r["suite"] == "kernels" for r in doc["results"])
    assert "decode_step_ms_b1" in proc.stdout and "hf_transformers" in proc.stdout


def test_suite_module_keeps_torch_out_of_the_bench_host() -> None:
    code = ("import sys, aioengine.bench.kernels as k, aioengine.bench.suites as s; "
            "assert 'kernels' in s.suite_names(); assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr

"""The peers suite without a llama.cpp build (the tests never build one): finding a build, the
skip in quick mode, llama-bench's JSON, and the serving half (start-up to /health, 8 streams
through the HTTP driver, resident memory of the process tree) against our own server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aioengine.bench import peers
from aioengine.bench.workload import TokenSpace, synthetic

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = Path(__file__).with_name("data") / "llama_bench_sample.json"


def _bench(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIOENGINE_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "aioengine.bench", "peers", "--no-progress",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_quick_mode_skips_without_llama_cpp(tmp_path: Path) -> None:
    proc = _bench(["--quick"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "suite peers skipped: no llama.cpp build at" in proc.stderr
    assert "--build-llama-cpp" in proc.stderr


def test_full_mode_without_llama_cpp_fails_saying_how_to_get_one(tmp_path: Path) -> None:
    proc = _bench([], tmp_path)
    assert proc.returncode == 1
    assert "suite peers failed" in proc.stderr and "pass --llama-cpp DIR" in proc.stderr


def test_a_directory_without_the_tools_is_named(tmp_path: Path) -> None:
    (tmp_path / "llama-bench").write_text("")
    with pytest.raises(peers.NoLlamaCpp, match=f"--llama-cpp {tmp_path}: no executable"):
        peers.find_llama_cpp(str(tmp_path))


def test_a_bin_directory_is_found(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    for tool in ("llama-bench", "llama-server"):
        p = tmp_path / "bin" / tool
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    assert peers.find_llama_cpp(str(tmp_path)) == tmp_path / "bin"


def test_llama_bench_json_is_read() -> None:
    dec, pre = peers.parse_llama_bench(SAMPLE.read_text())
    tests = json.loads(SAMPLE.read_text())
    assert pre == next(t["avg_ts"] for t in tests if t["n_prompt"])
    assert dec == next(t["avg_ts"] for t in tests if t["n_gen"])
    with pytest.raises(RuntimeError, match="lacks a decode or a prefill test"):
        peers.parse_llama_bench(json.dumps(tests[:1]))
    with pytest.raises(RuntimeError, match="printed no JSON"):
        peers.parse_llama_bench("error: model not found")


def test_serving_rows_against_our_own_server() -> None:
    work = synthetic(TokenSpace.of_model("tiny"), 6, (4, 16), (2, 6), 0)
    port = peers._free_port()
    cmd = peers.server_command(peers.OURS, Path("/nonexistent"), "tiny", port, 1, 8, 64)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        startup = peers._wait_health(url, proc, t0)
        rows, rss = asyncio.run(peers._streams(url, work, 8, proc.pid))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    got = {m: v for m, v, _ in rows}
    assert 0 < startup < peers.START_TIMEOUT
    assert got["output_tok_s"] > 0 and got["ttft_p50_ms"] <= got["ttft_p90_ms"]
    assert got["itl_p50_ms"] > 0
    # the engine's model process is a child of the server: the tree holds more than the server
    assert rss > 100  # MB: the server and its model process together


def test_decode_read_bytes_counts_quantized_weights() -> None:
    from aioengine.bench.peers import decode_read_bytes
    from aioengine.worker.loader import load_model

    fp32, _ = load_model("tiny", dtype="float32", device="cpu")
    q8, _ = load_model("tiny", dtype="float32", device="cpu", quantization="q8_0")
    embed = fp32.embed_tokens.weight
    params = sum(p.numel() * p.element_size() for p in fp32.parameters())
    assert decode_read_bytes(fp32) == params - embed.numel() * embed.element_size()
    # Q8_0 holds 34 bytes per 32 weights; rows that are not whole blocks stay float32
    assert 0.2 * decode_read_bytes(fp32) < decode_read_bytes(q8) < 0.5 * decode_read_bytes(fp32)

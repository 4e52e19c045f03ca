"""The peers suite without a llama.cpp build (the tests never build one): finding a build, the
skip in quick mode, llama-bench's JSON, file types and the quantized files' cache, our side's
child (default threads, the x8 switch) and the serving half (both servers' stages: 8 streams
and Poisson rates through the HTTP driver, start-up, memory) against our own server. With a
build in ``$AIOENGINE_LLAMA_CPP`` (a directory holding llama-bench, llama-server and
llama-quantize), one quick run on two file types of the real model against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import gguf
import numpy as np
import pytest

from aioengine.bench import peers
from aioengine.bench.options import BenchOptions
from aioengine.bench.peers import llama_cpp, serving, table
from aioengine.bench.peers.child import ours_child
from aioengine.bench.workload import TokenSpace, synthetic

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = Path(__file__).with_name("data") / "llama_bench_sample.json"
LLAMA_CPP = os.environ.get("AIOENGINE_LLAMA_CPP")


def _bench(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIOENGINE_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "aioengine.bench", "peers", "--no-progress",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_quick_mode_skips_without_llama_cpp(tmp_path: Path) -> None:
    proc = _bench(["--quick"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "suite peers skipped: no llama.cpp build at" in proc.stderr
    assert "--build-llama-cpp" in proc.stderr


def test_full_mode_without_llama_cpp_fails_saying_how_to_get_one(tmp_path: Path) -> None:
    proc = _bench([], tmp_path)
    assert proc.returncode == 1
    assert "suite peers failed" in proc.stderr and "pass --llama-cpp DIR" in proc.stderr


def test_our_side_alone_needs_no_llama_cpp_unless_one_is_named(tmp_path: Path,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv("AIOENGINE_CACHE", str(tmp_path / "empty"))
    src = _gguf(tmp_path / "m.gguf", 3)
    # no build anywhere: fine for our side, until a file of another type is to be made
    with pytest.raises(peers.NoLlamaCpp, match="making the q8_0 file needs llama-quantize"):
        peers.run(BenchOptions(model=src, only=("aioengine",), quants=("q8_0",)))
    with pytest.raises(peers.NoLlamaCpp, match=f"--llama-cpp {tmp_path}: no executable"):
        peers.run(BenchOptions(model=src, only=("aioengine",), llama_cpp=str(tmp_path)))
    with pytest.raises(peers.NoLlamaCpp, match=r"no llama\.cpp build at"):
        peers.run(BenchOptions(model=src, only=("serve",)))


def test_an_unknown_quant_type_is_refused_before_anything_runs(tmp_path: Path) -> None:
    proc = _bench(["--quants", "f32,q9_9"], tmp_path)
    assert proc.returncode == 2
    assert "--quants: unknown type 'q9_9'; known: f32, f16, q8_0" in proc.stderr
    assert llama_cpp.parse_quants(("f32,Q8_0", "q4_1", "q8_0,")) == ("f32", "q8_0", "q4_1")
    with pytest.raises(ValueError, match="unknown type 'q5_k'"):
        BenchOptions(quants=("q5_k",))


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
    with pytest.raises(peers.NoLlamaCpp, match="no executable llama-bench and llama-server "
                                               "and llama-quantize"):
        peers.find_llama_cpp(str(tmp_path), llama_cpp.TOOLS)


def test_a_build_in_the_cache_is_used_not_rebuilt(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AIOENGINE_CACHE", str(tmp_path))
    bindir = tmp_path / "llama.cpp" / "bin"
    bindir.mkdir(parents=True)
    for tool in llama_cpp.TOOLS:
        (bindir / tool).write_text("#!/bin/sh\n")
        (bindir / tool).chmod(0o755)
    monkeypatch.setattr(llama_cpp, "build_llama_cpp", lambda log: pytest.fail("rebuilt"))
    assert llama_cpp.llama_cpp_dir(None, build=True) == bindir
    assert llama_cpp.llama_cpp_dir(None, build=False) == bindir
    (bindir / "llama-quantize").unlink()  # an older build: --build-llama-cpp builds again
    monkeypatch.setattr(llama_cpp, "build_llama_cpp", lambda log: tmp_path / "new")
    assert llama_cpp.llama_cpp_dir(None, build=True) == tmp_path / "new"
    assert llama_cpp.llama_cpp_dir(None, build=False) == bindir
    with pytest.raises(peers.NoLlamaCpp, match="--llama-cpp /nowhere: no executable"):
        llama_cpp.llama_cpp_dir("/nowhere", build=True)


def test_llama_bench_json_is_read() -> None:
    dec, pre = peers.parse_llama_bench(SAMPLE.read_text())
    tests = json.loads(SAMPLE.read_text())
    assert pre == next(t["avg_ts"] for t in tests if t["n_prompt"])
    assert dec == next(t["avg_ts"] for t in tests if t["n_gen"])
    with pytest.raises(RuntimeError, match="lacks a decode or a prefill test"):
        peers.parse_llama_bench(json.dumps(tests[:1]))
    with pytest.raises(RuntimeError, match="printed no JSON"):
        peers.parse_llama_bench("error: model not found")


def _gguf(path: Path, file_type: int | None) -> str:
    """A GGUF file with a string array and an int before ``general.file_type`` (the reader
    must step over them), and one tensor."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list(["a", "bc", "déf"] * 100)
    w.add_block_count(2)
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_tensor("x", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_file_types_are_read_from_the_header(tmp_path: Path) -> None:
    assert llama_cpp.gguf_file_type(_gguf(tmp_path / "a.gguf", 3)) == "q4_1"
    assert llama_cpp.gguf_file_type(_gguf(tmp_path / "b.gguf", 15)) == "q4_k_m"
    assert llama_cpp.gguf_file_type(_gguf(tmp_path / "c.gguf", 0)) == "f32"
    with pytest.raises(ValueError, match=r"has no general\.file_type"):
        llama_cpp.gguf_file_type(_gguf(tmp_path / "d.gguf", None))
    with pytest.raises(ValueError, match=r"general\.file_type 19 is not one of the types"):
        llama_cpp.gguf_file_type(_gguf(tmp_path / "e.gguf", 19))
    (tmp_path / "f.gguf").write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="is not a GGUF file"):
        llama_cpp.gguf_file_type(str(tmp_path / "f.gguf"))


def test_files_of_other_types_need_llama_quantize(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AIOENGINE_CACHE", str(tmp_path / "cache"))
    src = _gguf(tmp_path / "m.gguf", 3)
    assert llama_cpp.model_files(src, (), None) == [("q4_1", src)]
    assert llama_cpp.model_files(src, ("q4_1",), None) == [("q4_1", src)]
    with pytest.raises(peers.NoLlamaCpp, match="making the q8_0 file needs llama-quantize"):
        llama_cpp.model_files(src, ("q4_1", "q8_0"), tmp_path)
    # the cache key follows the source: a changed file gets new files
    before = llama_cpp.quantized_dir(src)
    assert before.parent == tmp_path / "cache" / "llama.cpp" / "models"
    os.utime(src, ns=(1, 1))
    assert llama_cpp.quantized_dir(src) != before


def test_the_model_must_be_a_gguf_file() -> None:
    with pytest.raises(ValueError, match=r"compares on GGUF files: --model FILE\.gguf or a "
                                         r"package model"):
        peers.source_file("tiny")


def test_our_child_reports_the_default_threads_and_the_x8_switch() -> None:
    spec = {"model": "tiny", "decode_tokens": 4, "prefill_len": 32, "quantization": "q8_0",
            "threads": None, "decode_only": True}
    on = ours_child({**spec, "x8": True})
    off = ours_child({**spec, "threads": 2, "x8": False})
    assert on["x8_fraction"] > 0.3 and off["x8_fraction"] == 0
    assert on["float_fraction"] == pytest.approx(off["float_fraction"], abs=1e-3)
    # the default is what ModelRunner picks with num_threads unset: the quantized kernels run
    # on the measured count (torch keeps its CPUs-1); an explicit count is every pool's
    from aioengine.config import EngineConfig
    from aioengine.worker.threads import threads_per_rank, usable_cpus

    assert on["threads"] == on["kernel_threads"] == on["gemv_threads"]
    assert 1 <= on["threads"] <= usable_cpus()
    assert on["torch_threads"] == threads_per_rank(EngineConfig(model="tiny"), 1)
    assert off["threads"] == off["torch_threads"] == off["kernel_threads"] == 2
    assert on["threads_measured"] in (0, 1) and off["threads_measured"] == 0  # none to measure
    assert on["decode_tok_s"] > 0 and "prefill_tok_s" not in on


def test_serving_stages_against_our_own_server(tmp_path: Path) -> None:
    space = TokenSpace.of_model("tiny")
    closed = synthetic(space, 6, (4, 16), (2, 6), 0)
    rated = [(4.0, synthetic(space, 5, (4, 16), (2, 6), 1)),
             (16.0, synthetic(space, 5, (4, 16), (2, 6), 2))]
    port = serving.free_port()
    cmd = serving.server_command(peers.OURS, Path("/nonexistent"), "tiny", port, 1, 8, 64)
    got: dict[str, tuple[float, str]] = {}

    def report(kind: str, metric: str, value: float, unit: str) -> None:
        assert kind == peers.OURS
        got[metric] = (value, unit)

    serving.serving_rows([(peers.OURS, cmd, port, None)], closed, 8, rated, report)
    values = {m: v for m, (v, _) in got.items()}
    assert 0 < values["serve_startup_s"] < serving.START_TIMEOUT
    for stage in ("serve", "serve_4rps", "serve_16rps"):
        assert values[f"{stage}_output_tok_s"] > 0
        assert 0 < values[f"{stage}_ttft_p50_ms"] <= values[f"{stage}_ttft_p90_ms"]
        assert 0 < values[f"{stage}_itl_p50_ms"] <= values[f"{stage}_itl_p90_ms"]
    # the engine's model process is a child of the server: the tree holds more than the server
    assert values["serve_rss_mb"] > 100 and got["serve_rss_mb"][1] == "MB"
    assert values["serve_rss_max_mb"] >= values["serve_rss_mb"]
    # PSS counts the pages the host and the engine share (the shm rings, libraries) once
    assert 100 < values["serve_pss_mb"] < values["serve_rss_mb"]
    assert got["serve_pss_mb"][1] == "MB"
    assert values["serve_pss_max_mb"] >= values["serve_pss_mb"]
    with pytest.raises(OSError):  # the server is gone
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "none"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else "none"


def test_read_bandwidth_of_each_kind_of_pages() -> None:
    from aioengine.bench.peers import child

    gbs_4k, huge_4k = child.read_bandwidth(8, 1, "4k", reps=2)
    assert gbs_4k > 0.1 and huge_4k == 0
    gbs_huge, huge = child.read_bandwidth(8, 2, "huge", reps=2)
    assert gbs_huge > 0.1
    if _thp_mode() in ("always", "madvise"):  # the kernel grants them on advice
        assert huge > 0.9
    with pytest.raises(ValueError, match="pages must be one of huge, 4k, got '1g'"):
        child.page_buffer(1 << 20, "1g")
    import torch

    small = torch.ones(16)  # malloc's heap, far below a huge page
    assert 0 <= child.huge_page_fraction([small]) <= 1
    assert child.huge_page_fraction([]) == 0


def test_our_full_child_reads_both_kinds_at_its_thread_count() -> None:
    spec = {"model": "tiny", "decode_tokens": 4, "prefill_len": 16, "quantization": "q8_0",
            "threads": 1}
    got = ours_child(spec)
    assert got["threads"] == 1 and got["prefill_tok_s"] > 0
    for pages in ("huge", "4k"):
        assert got[f"read_gbytes_per_s_{pages}"] > 0.1
    assert got["read_huge_fraction_4k"] == 0 and 0 <= got["weights_huge_fraction"] <= 1


SHARING = """
import mmap, os, sys, time
m = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_SHARED)
m.write(b"x" * (64 << 20))
if os.fork() == 0:  # the child maps every page too (a fork does not copy shared mappings' PTEs)
    assert sum(m[i] for i in range(0, 64 << 20, 4096)) == ord("x") * (16 << 10)
    print("ready", flush=True)
time.sleep(60)
"""


def test_tree_pss_counts_pages_shared_in_the_tree_once() -> None:
    """A parent and its child both map the same 64 MiB: RSS counts it in each process, PSS
    once for the tree. Without smaps_rollup (Linux < 4.14) there is no PSS: None."""
    proc = subprocess.Popen([sys.executable, "-c", SHARING], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert len(serving.tree_pids(proc.pid)) == 2
        rss, pss = serving.tree_rss_mb(proc.pid), serving.tree_pss_mb(proc.pid)
        assert pss is not None
        assert rss >= 128 and pss >= 64
        assert rss - pss >= 60, (rss, pss)  # the shared 64 MiB counted once, not twice
    finally:
        for pid in serving.tree_pids(proc.pid)[::-1]:
            os.kill(pid, 9)
        proc.wait()


def test_decode_read_bytes_counts_quantized_weights() -> None:
    from aioengine.worker.loader import load_model

    fp32, _ = load_model("tiny", dtype="float32", device="cpu")
    q8, _ = load_model("tiny", dtype="float32", device="cpu", quantization="q8_0")
    embed = fp32.embed_tokens.weight
    params = sum(p.numel() * p.element_size() for p in fp32.parameters())
    assert peers.decode_read_bytes(fp32) == params - embed.numel() * embed.element_size()
    # Q8_0 holds 34 bytes per 32 weights; rows that are not whole blocks stay float32
    assert 0.2 * peers.decode_read_bytes(fp32) < peers.decode_read_bytes(q8) \
        < 0.5 * peers.decode_read_bytes(fp32)
    from aioengine.bench.peers.child import decode_tensors

    for model in (fp32, q8):  # the tensors whose pages are looked at: those read, and the table
        assert sum(t.numel() * t.element_size() for t in decode_tensors(model)) == \
            peers.decode_read_bytes(model) + embed.numel() * embed.element_size()


def _run_json(rows: list[tuple[str, str, float, str]], config: dict) -> dict:
    return {"results": [{"suite": "peers", "name": n, "metric": m, "value": v, "unit": u}
                        for n, m, v, u in rows], "config": config}


def test_the_table_script_prints_the_readme_rows(tmp_path: Path) -> None:
    a = _run_json([("llama.cpp", "q4_1.decode_tok_s_t1", 90.0, "tok/s"),
                   ("aioengine", "q4_1.decode_tok_s_t1", 99.0, "tok/s"),
                   ("aioengine", "q4_1.default_threads", 2, "threads"),
                   ("aioengine", "q4_1.decode_tok_s_tdefault", 120.0, "tok/s"),
                   ("llama.cpp", "q4_1.decode_tok_s_tdefault", 100.0, "tok/s"),
                   ("llama.cpp", "q4_1.serve_4rps_itl_p50_ms", 40.0, "ms"),
                   ("aioengine", "q4_1.serve_4rps_itl_p50_ms", 50.0, "ms")],
                  {"model": "m.gguf", "quants": ["q4_1"], "llama_cpp": "/lb"})
    b = _run_json([("llama.cpp", "f32.serve_rss_mb", 700.0, "MB"),
                   ("aioengine", "f32.serve_rss_mb", 1400.0, "MB"),
                   ("aioengine", "f32.serve_startup_s", 2.0, "s"),
                   ("aioengine", "f32.serve_pss_mb", 1300.0, "MB"),
                   ("llama.cpp", "f32.serve_pss_mb", 650.0, "MB"),
                   ("llama.cpp", "f32.serve_startup_s", 0.5, "s")],
                  {"model": "m.gguf", "quants": ["f32"], "x8": False})
    paths = []
    for i, doc in enumerate((a, b)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "aioengine.bench.peers.table",
                           *map(str, paths)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert ("`python -m aioengine.bench peers --model m.gguf --quants q4_1 --llama-cpp /lb`; "
            "`python -m aioengine.bench peers --model m.gguf --quants f32 --no-x8`") in out
    assert ("| peers (full) | Q4_1 GGUF, batch-1 decode tok/s, 1 / default (2) threads | "
            "99 / 120 | 90 / 100 | 1.10x / 1.20x |") in out
    assert "| peers (full) | Q4_1 GGUF, Poisson 4 req/s: ITL p50 ms | 50 | 40 | 0.80x |" in out
    assert ("| peers (full) | F32 GGUF, resident MB under load (process tree); start-up to "
            "/health 200 s | 1,400 / 2 | 700 / 0.5 | 0.50x / 0.25x |") in out
    assert ("| peers (full) | F32 GGUF, proportional MB under load (process tree, PSS: shared "
            "pages once) | 1,300 | 650 | 0.50x |") in out
    assert "Q4_1 GGUF, proportional MB" not in out  # a run without PSS figures: no row
    full = table.main([str(paths[0]), "--format", "full"])
    assert full == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": []}))
    proc = subprocess.run([sys.executable, "-m", "aioengine.bench.peers.table", str(bad)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "no peers results in" in proc.stderr


@pytest.mark.skipif(not LLAMA_CPP, reason="set AIOENGINE_LLAMA_CPP to a llama.cpp build "
                                          "(llama-bench, llama-server, llama-quantize)")
def test_two_file_types_against_llama_cpp(tmp_path: Path, aioengine_cache: str) -> None:
    """The real model's Q4_1 file and a Q8_0 made from it, decode rows of both sides."""
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "aioengine.bench", "peers", "--no-progress", "--quick",
         "--model", "smollm2-135m-instruct", "--quants", "q8_0,q4_1", "--threads", "1",
         "--llama-cpp", str(LLAMA_CPP), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = {(r["name"], r["metric"]): r["value"] for r in json.loads(out.read_text())["results"]}
    for quant in ("q8_0", "q4_1"):
        for side in (peers.BASELINE, peers.OURS):
            assert rows[(side, f"{quant}.decode_tok_s_t1")] > 1
            assert rows[(side, f"{quant}.decode_tok_s_tdefault")] > 1
        assert rows[(peers.OURS, f"{quant}.x8_fraction")] > 0.5  # both types have x8 kernels
    made = list((Path(aioengine_cache) / "llama.cpp" / "models").glob("*/*.q8_0.gguf"))
    assert made and llama_cpp.gguf_file_type(str(made[0])) == "q8_0"

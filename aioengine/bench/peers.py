"""The ``peers`` suite: aioengine side by side with llama.cpp on the same GGUF file.

``python -m aioengine.bench peers --model FILE.gguf --llama-cpp DIR`` (``DIR`` holds
``llama-bench`` and ``llama-server``, or their ``bin/``), or ``--build-llama-cpp`` to build
llama.cpp once from the sources vendored in the ``llama-cpp-python`` sdist into
``$AIOENGINE_CACHE/llama.cpp`` (pip, cmake and a C++ compiler; ~10+ minutes on 2 cores). A
llama.cpp built there earlier is found by itself. Without one, quick mode skips the suite
with a message (``make bench`` stays build-free) and full mode fails saying how to get one.

Rows (names ``aioengine`` and ``llama.cpp``, the baseline), A/B alternated per round:

- ``decode_tok_s_t{1,2}``: batch-1 decode tokens per second at that many threads (llama-bench
  ``-p 0 -n N``; ours: ``ModelRunner.execute`` steps with ``num_threads=T``, greedy);
- ``prefill512_tok_s_t{1,2}``: one 512-token prompt (llama-bench ``-p 512 -n 0``);
- ``read_gbytes_per_s`` (``machine``): the measured read bandwidth (``read_bandwidth``: a
  streaming pass over 512 MiB, best over 1..CPUs threads); ``decode_bw_fraction_t{T}``:
  weight bytes read per second at batch-1 decode over the bandwidth measured in the same child
  right after (the machine is shared: both under the same conditions);
- serving (full mode): ``serve_*`` at 8 concurrent streams through the same HTTP driver
  against ``python -m aioengine.serve`` and ``llama-server --parallel 8``: output tok/s,
  TTFT/ITL p50/p90, start-up seconds to a 200 on ``/health``, resident MB at the end of the
  load (the whole process tree).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aioengine.bench.options import BenchOptions
from aioengine.bench.results import Result

SUITE = "peers"
BASELINE = "llama.cpp"
OURS = "aioengine"
MARK = "PEERS-RESULTS "
SDIST = "llama-cpp-python==0.3.36"
CHILD_TIMEOUT = 900.0
START_TIMEOUT = 300.0


class NoLlamaCpp(RuntimeError):
    """No llama.cpp build to compare with; the message says how to get one."""


@dataclass(frozen=True)
class Sizes:
    threads: tuple[int, ...]
    rounds: int
    decode_tokens: int
    prefill_len: int
    serve_requests: int  # 0: no serving rows
    serve_streams: int
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int]


FULL = Sizes(threads=(1, 2), rounds=2, decode_tokens=64, prefill_len=512, serve_requests=32,
             serve_streams=8, prompt_lens=(16, 256), output_lens=(32, 128))
QUICK = Sizes(threads=(1, 2), rounds=1, decode_tokens=16, prefill_len=128, serve_requests=0,
              serve_streams=8, prompt_lens=(16, 64), output_lens=(8, 16))


# ---- finding or building llama.cpp -------------------------------------------------------------

def cache_build_dir() -> Path:
    from aioengine.config import cache_dir

    return Path(cache_dir()) / "llama.cpp"


def find_llama_cpp(given: str | None) -> Path:
    """The directory holding ``llama-bench`` and ``llama-server``: ``given`` (or its ``bin/``),
    else an earlier ``--build-llama-cpp`` in the cache; ``NoLlamaCpp`` otherwise."""
    candidates = [Path(given), Path(given) / "bin"] if given else [cache_build_dir() / "bin"]
    for d in candidates:
        if all((d / tool).is_file() and os.access(d / tool, os.X_OK)
               for tool in ("llama-bench", "llama-server")):
            return d
    if given:
        raise NoLlamaCpp(f"--llama-cpp {given}: no executable llama-bench and llama-server "
                         "there or in its bin/")
    raise NoLlamaCpp(f"no llama.cpp build at {candidates[0]}: pass --llama-cpp DIR or "
                     "--build-llama-cpp (builds it there once)")


def build_llama_cpp(log=sys.stderr) -> Path:
    """Download the ``llama-cpp-python`` sdist, build llama-bench, llama-server and
    llama-quantize from its vendored llama.cpp (native CPU flags, no curl) into the cache."""
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise NoLlamaCpp(f"--build-llama-cpp needs {tool} on PATH")
    root = cache_build_dir()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        print(f"peers: downloading the {SDIST} sdist ...", file=log, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", SDIST, "-d", tmp], check=True, capture_output=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        subprocess.run(["tar", "xzf", str(sdist), "-C", tmp], check=True)
        src = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = root / "build"
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        print(f"peers: building llama.cpp into {build} (minutes) ...", file=log, flush=True)
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), *gen, "-DGGML_NATIVE=ON",
                        "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release",
                        "-DLLAMA_BUILD_TESTS=OFF"], check=True, capture_output=True)
        subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1),
                        "--target", "llama-bench", "llama-server", "llama-quantize"],
                       check=True, capture_output=True)
        # shared libraries sit next to the binaries in build/bin; link bin -> build/bin
        link = root / "bin"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(build / "bin")
    return find_llama_cpp(None)


# ---- the suite ---------------------------------------------------------------------------------

def run(options: BenchOptions) -> list[Result]:
    sizes = QUICK if options.quick else FULL
    if options.threads is not None:
        sizes = Sizes(**{**asdict(sizes), "threads": (options.threads,)})
    try:
        if options.build_llama_cpp and options.llama_cpp is None:
            bindir = build_llama_cpp()
        else:
            bindir = find_llama_cpp(options.llama_cpp)
    except NoLlamaCpp as e:
        if options.quick:
            print(f"suite peers skipped: {e}", file=sys.stderr, flush=True)
            return []
        raise
    model = options.model
    if not model.endswith(".gguf") or not os.path.isfile(model):
        message = f"the peers suite compares on one GGUF file: --model FILE.gguf (got {model!r})"
        if options.quick:
            print(f"suite peers skipped: {message}", file=sys.stderr, flush=True)
            return []
        raise ValueError(message)
    rows: list[Result] = []
    samples: dict[tuple[str, str], list[float]] = {}

    def add(name: str, metric: str, value: float) -> None:
        samples.setdefault((name, metric), []).append(value)
        if options.progress:  # each figure as it comes: a long run cut short keeps them
            print(f"peers: {name} {metric} {value:.4g}", file=sys.stderr, flush=True)

    for _ in range(sizes.rounds):
        for t in sizes.threads:
            if options.wants(BASELINE):
                dec, pre = llama_bench(bindir, model, t, sizes.decode_tokens, sizes.prefill_len)
                add(BASELINE, f"decode_tok_s_t{t}", dec)
                add(BASELINE, f"prefill{sizes.prefill_len}_tok_s_t{t}", pre)
            if options.wants(OURS):
                got = _ours_child({"op": "kernels", "model": model, "threads": t,
                                   "decode_tokens": sizes.decode_tokens,
                                   "prefill_len": sizes.prefill_len,
                                   "quantization": options.quantization})
                weight_bytes = float(got["weight_bytes"])
                add("machine", "read_gbytes_per_s", got["read_gbytes_per_s"])
                add(OURS, f"decode_bw_fraction_t{t}",
                    got["decode_tok_s"] * weight_bytes / 1e9 / got["read_gbytes_per_s"])
                add(OURS, f"decode_tok_s_t{t}", got["decode_tok_s"])
                add(OURS, f"prefill{sizes.prefill_len}_tok_s_t{t}", got["prefill_tok_s"])
    units = {"read_gbytes_per_s": "GB/s"}
    for (name, metric), vals in samples.items():
        unit = "fraction" if "fraction" in metric else units.get(metric, "tok/s")
        rows.append(Result(SUITE, name, metric, statistics.median(vals), unit,
                           samples=tuple(vals)))
    if sizes.serve_requests:
        rows += serve_rows(bindir, model, sizes, max(sizes.threads), options)
    return rows


def llama_bench(bindir: Path, model: str, threads: int, decode_tokens: int,
                prefill_len: int) -> tuple[float, float]:
    """(decode tok/s, prefill tok/s) from one llama-bench run (3 repetitions each)."""
    cmd = [str(bindir / "llama-bench"), "-m", model, "-t", str(threads), "-r", "3",
           "-p", f"0,{prefill_len}", "-n", f"{decode_tokens},0", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return parse_llama_bench(proc.stdout)


def parse_llama_bench(text: str) -> tuple[float, float]:
    """llama-bench ``-o json`` -> (decode tok/s of the ``n_gen`` test, prefill tok/s of the
    ``n_prompt`` test); a missing test is a clear error."""
    try:
        tests = json.loads(text)
    except ValueError as e:
        raise RuntimeError(f"llama-bench printed no JSON: {text[:300]!r}") from e
    dec = [t["avg_ts"] for t in tests if t.get("n_gen", 0) > 0 and t.get("n_prompt", 0) == 0]
    pre = [t["avg_ts"] for t in tests if t.get("n_prompt", 0) > 0 and t.get("n_gen", 0) == 0]
    if not dec or not pre:
        raise RuntimeError(f"llama-bench output lacks a decode or a prefill test: {text[:300]!r}")
    return float(dec[0]), float(pre[0])


def _ours_child(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "aioengine.bench.peers", json.dumps(spec)],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"peers bench child failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(MARK):])


# ---- serving -----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, proc: subprocess.Popen, t0: float) -> float:
    while time.perf_counter() - t0 < START_TIMEOUT:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before /health")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url}/health did not answer 200 within {START_TIMEOUT:.0f} s")


def tree_rss_mb(pid: int) -> float:
    """Resident MB of a process and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
            total += int(m.group(1)) if m else 0
        except OSError:
            pass
    return total / 1024


def server_command(kind: str, bindir: Path, model: str, port: int, threads: int,
                   streams: int, ctx: int, quantization: str | None = None) -> list[str]:
    if kind == BASELINE:
        return [str(bindir / "llama-server"), "-m", model, "--port", str(port), "-t",
                str(threads), "--parallel", str(streams), "-c", str(ctx * streams),
                "--host", "127.0.0.1"]
    ours = [sys.executable, "-m", "aioengine.serve", "--model", model, "--port", str(port),
            "--host", "127.0.0.1", "--max-model-len", str(ctx), "--max-num-seqs", str(streams)]
    return ours + (["--quantization", quantization] if quantization else [])


def serve_rows(bindir: Path, model: str, sizes: Sizes, threads: int,
               options: BenchOptions) -> list[Result]:
    from aioengine.bench.workload import TokenSpace, synthetic

    space = TokenSpace.of_model(model)
    work = synthetic(space, sizes.serve_requests, sizes.prompt_lens, sizes.output_lens, 7)
    ctx = sizes.prompt_lens[1] + sizes.output_lens[1] + 16
    rows: list[Result] = []
    for kind in (BASELINE, OURS):
        if not options.wants(kind):
            continue
        port = _free_port()
        cmd = server_command(kind, bindir, model, port, threads, sizes.serve_streams, ctx,
                             options.quantization)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            rows.append(Result(SUITE, kind, "serve_startup_s", _wait_health(url, proc, t0), "s"))
            got, rss = asyncio.run(_streams(url, work, sizes.serve_streams, proc.pid))
            rows += [Result(SUITE, kind, f"serve_{m}", v, u) for m, v, u in got]
            rows.append(Result(SUITE, kind, "serve_rss_mb", rss, "MB"))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return rows


async def _streams(url: str, work, streams: int, pid: int):
    from aioengine.bench.http_driver import HTTPDriver
    from aioengine.bench.latency import percentile

    sem = asyncio.Semaphore(streams)
    rss: list[float] = []
    async with HTTPDriver(url) as http:
        await http.one(work.prompts[0][:8], 4)  # warm-up

        async def one(i: int):
            async with sem:
                rec = await http.one(work.prompts[i], work.output_lens[i])
                if i == len(work) // 2:
                    rss.append(tree_rss_mb(pid))
                return rec

        t0 = time.perf_counter()
        recs = await asyncio.gather(*(one(i) for i in range(len(work))))
        wall = time.perf_counter() - t0
    bad = [r.error for r in recs if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(recs)} requests to {url} failed: {bad[0]}")
    ttft = [r.ttft * 1000 for r in recs]
    itl = [x * 1000 for r in recs for x in r.itls]
    rows = [("output_tok_s", sum(r.tokens for r in recs) / wall, "tok/s")]
    for q in (50, 90):
        rows.append((f"ttft_p{q}_ms", percentile(ttft, q), "ms"))
        rows.append((f"itl_p{q}_ms", percentile(itl, q), "ms"))
    return rows, max([*rss, tree_rss_mb(pid)])


# ---- the child: our engine, torch imported -----------------------------------------------------

def read_bandwidth(mib: int = 512, reps: int = 5) -> float:
    """GB/s of one streaming pass over ``mib`` MiB of float32, the best over 1..CPUs threads.
    The pass is the float32 GEMV kernel's (a dot product per 16 KiB row: two flops per 4 bytes,
    far below what the cores can do, so it runs at the read limit: 24 GB/s on one thread here
    where a plain vector sum loop reached 25). torch's ``sum`` is not a bandwidth test: it
    reached half of that."""
    import torch

    from aioengine.worker import gemv

    kernel = gemv.GemvKernel(str(gemv.ensure_built()))
    k = 4096
    w = torch.ones(mib * 1024 * 1024 // 4 // k, k)
    x = torch.ones(1, k)
    best = 0.0
    for threads in range(1, (os.cpu_count() or 1) + 1):
        kernel(x, w, threads=threads)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            kernel(x, w, threads=threads)
            times.append(time.perf_counter() - t0)
        best = max(best, w.numel() * 4 / statistics.median(times) / 1e9)
    return best


def _child(spec: dict) -> dict:
    import torch

    from aioengine.bench.kernels import _OurModel
    from aioengine.config import EngineConfig
    from aioengine.worker.model_runner import ModelRunner

    block, steps = 16, spec["decode_tokens"]
    longest = max(spec["prefill_len"], 256 + steps + 8)
    per_seq = -(-longest // block)
    config = EngineConfig(model=spec["model"], block_size=block, num_kv_blocks=per_seq,
                          max_num_seqs=1, num_threads=spec["threads"], dtype="float32",
                          quantization=spec.get("quantization"))
    runner = ModelRunner(config)
    runner.allocate_kv_cache(per_seq)
    ours = _OurModel(runner, per_seq)
    vocab = runner.spec.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, 256), generator=g).tolist()
    ms = ours.decode_ms(prompt, 5, steps)
    pre = torch.randint(0, vocab, (1, spec["prefill_len"]), generator=g).tolist()
    return {"decode_tok_s": 1000 / ms, "read_gbytes_per_s": read_bandwidth(256),
            "prefill_tok_s": ours.prefill_tokens_per_s(pre, 2),
            "weight_bytes": decode_read_bytes(runner.model)}


def decode_read_bytes(model: Any) -> int:
    """Weight bytes a batch-1 decode step reads: every float parameter and quantized weight,
    less the input embedding table (one row is looked up) unless the float head is that table."""
    total = 0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            total += p.numel() * p.element_size()
        for attr in ("qweight", "qhead"):
            quantized = getattr(module, attr, None)
            if quantized is not None:
                total += quantized.nbytes
    embed = model.embed_tokens
    if embed.weight is not None and (model.lm_head is not None or embed.qhead is not None):
        total -= embed.weight.numel() * embed.weight.element_size()
    return total


if __name__ == "__main__":
    print(MARK + json.dumps(_child(json.loads(sys.argv[1]))), flush=True)

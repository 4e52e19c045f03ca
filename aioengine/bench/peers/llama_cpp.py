"""llama.cpp for the ``peers`` suite: finding or building its tools, running ``llama-bench``, and
making the suite's GGUF files of other types with ``llama-quantize`` (cached)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

from aioengine.bench.peers import procs

SDIST = "llama-cpp-python==0.3.36"
TOOLS = ("llama-bench", "llama-server", "llama-quantize")
CHILD_TIMEOUT = 900.0
BUILD_TIMEOUT = 3600.0  # a build on a small machine takes many minutes (docs/benchmarks.md)

QUANTS = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q4_k_m", "q4_k_s", "q6_k")
"""Types ``--quants`` may ask for: llama-quantize's names, lower case (our engine reads every
tensor type these files hold; where it has no kernel for one it runs that tensor in float)."""

# gguf's LlamaFileType (general.file_type) -> the name above
_FILE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 14: "q4_k_s", 15: "q4_k_m",
               18: "q6_k", 32: "bf16"}
FLOAT_TYPES = ("f32", "f16", "bf16")


class NoLlamaCpp(RuntimeError):
    """No llama.cpp build to compare with; the message says how to get one."""


def cache_build_dir() -> Path:
    from aioengine.config import cache_dir

    return Path(cache_dir()) / "llama.cpp"


def find_llama_cpp(given: str | None, need: tuple[str, ...] = TOOLS[:2]) -> Path:
    """The directory holding ``need`` (``llama-bench`` and ``llama-server``; ``llama-quantize``
    too when files are to be made): ``given`` (or its ``bin/``), else an earlier
    ``--build-llama-cpp`` in the cache; ``NoLlamaCpp`` otherwise."""
    candidates = [Path(given), Path(given) / "bin"] if given else [cache_build_dir() / "bin"]
    for d in candidates:
        if all((d / tool).is_file() and os.access(d / tool, os.X_OK) for tool in need):
            return d
    if given:
        raise NoLlamaCpp(f"--llama-cpp {given}: no executable {' and '.join(need)} there or in "
                         "its bin/")
    raise NoLlamaCpp(f"no llama.cpp build at {candidates[0]}: pass --llama-cpp DIR or "
                     "--build-llama-cpp (builds it there once)")


def llama_cpp_dir(given: str | None, build: bool, log=sys.stderr) -> Path:
    """``--llama-cpp DIR``, else the cache's build; ``build`` (``--build-llama-cpp``) builds
    it there first when it is missing or lacks one of ``TOOLS`` (an older build)."""
    if given is not None:
        return find_llama_cpp(given)
    try:
        return find_llama_cpp(None, TOOLS if build else TOOLS[:2])
    except NoLlamaCpp:
        if not build:
            raise
    return build_llama_cpp(log)


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
        _build_step("pip download", [sys.executable, "-m", "pip", "download", "--no-deps",
                                     "--no-binary", ":all:", SDIST, "-d", tmp], 600)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        _build_step("tar", ["tar", "xzf", str(sdist), "-C", tmp], 300)
        src = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = root / "build"
        shutil.rmtree(build, ignore_errors=True)  # its CMake cache names an older source tree
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        print(f"peers: building llama.cpp into {build} (minutes) ...", file=log, flush=True)
        _build_step("cmake", ["cmake", "-S", str(src), "-B", str(build), *gen,
                              "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release",
                              "-DLLAMA_BUILD_TESTS=OFF"], 600)
        _build_step("cmake --build", ["cmake", "--build", str(build), "-j",
                                      str(os.cpu_count() or 1), "--target", *TOOLS], BUILD_TIMEOUT)
        # shared libraries sit next to the binaries in build/bin; link bin -> build/bin
        link = root / "bin"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(build / "bin")
    return find_llama_cpp(None, TOOLS)


def _build_step(what: str, cmd: list[str], timeout: float) -> None:
    """One step of the build in its own process group (stopped with the bench); a failure
    names the step and shows the end of its output."""
    proc = procs.run(cmd, timeout=timeout)
    if proc.returncode != 0:
        raise NoLlamaCpp(f"--build-llama-cpp: {what} failed ({proc.returncode}):\n"
                         f"{(proc.stdout + proc.stderr)[-3000:]}")


# ---- llama-bench -------------------------------------------------------------------------------

def llama_bench(bindir: Path, model: str, threads: int, decode_tokens: int,
                prefill_len: int) -> tuple[float, float]:
    """(decode tok/s, prefill tok/s) from one llama-bench run (3 repetitions each)."""
    cmd = [str(bindir / "llama-bench"), "-m", model, "-t", str(threads), "-r", "3",
           "-p", f"0,{prefill_len}", "-n", f"{decode_tokens},0", "-o", "json"]
    proc = procs.run(cmd, timeout=CHILD_TIMEOUT)
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


# ---- the files: their type, and the other types made with llama-quantize -----------------------

def parse_quants(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--quants`` values (each may be a comma-separated list) -> known type names, in order,
    each once; ValueError naming an unknown one."""
    out: list[str] = []
    for value in values:
        for name in value.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name not in QUANTS:
                raise ValueError(f"--quants: unknown type {name!r}; known: {', '.join(QUANTS)}")
            if name not in out:
                out.append(name)
    return tuple(out)


def _skip_value(f, vtype: int) -> None:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype == 8:  # string
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(n, 1)
    elif vtype == 9:  # array
        itype, count = struct.unpack("<IQ", f.read(12))
        if itype == 8:
            for _ in range(count):
                (n,) = struct.unpack("<Q", f.read(8))
                f.seek(n, 1)
        elif itype in sizes:
            f.seek(sizes[itype] * count, 1)
        else:
            raise ValueError(f"GGUF array of value type {itype}")
    elif vtype in sizes:
        f.seek(sizes[vtype], 1)
    else:
        raise ValueError(f"GGUF value type {vtype}")


def gguf_file_type(path: str) -> str:
    """The type of a GGUF file (``general.file_type``: ``q4_1``, ``f32``, ``q4_k_m``, ...),
    read from its header without parsing the tensors. ValueError for a file that is not GGUF
    or has no known type."""
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, _tensors, kvs = struct.unpack("<IQQ", head[4:])
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is too old")
        for _ in range(kvs):
            (n,) = struct.unpack("<Q", f.read(8))
            key = f.read(n)
            (vtype,) = struct.unpack("<I", f.read(4))
            if key == b"general.file_type" and vtype in (4, 5):
                (value,) = struct.unpack("<I", f.read(4))
                if value not in _FILE_TYPES:
                    raise ValueError(f"{path}: general.file_type {value} is not one of the "
                                     f"types the peers suite knows ({', '.join(QUANTS)})")
                return _FILE_TYPES[value]
            _skip_value(f, vtype)
    raise ValueError(f"{path} has no general.file_type")


def quantized_dir(source: str) -> Path:
    """Where the files made from ``source`` are cached: next to the llama.cpp build, keyed by
    the source's path, size and modification time (a changed source makes new files)."""
    st = os.stat(source)
    key = hashlib.sha256(f"{os.path.realpath(source)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return cache_build_dir() / "models" / f"{Path(source).stem}-{key.hexdigest()[:12]}"


def model_files(source: str, quants: tuple[str, ...], bindir: Path | None,
                log=sys.stderr) -> list[tuple[str, str]]:
    """``[(type, path)]``: the source itself (no ``quants``) or one file per asked type, the
    source where it already is that type, else made from it once with ``llama-quantize``
    (``--allow-requantize`` when the source is quantized: its weights are dequantized first,
    so a file made from a 4-bit source carries that source's rounding)."""
    have = gguf_file_type(source)
    if not quants:
        return [(have, source)]
    out: list[tuple[str, str]] = []
    for quant in quants:
        if quant == have:
            out.append((quant, source))
            continue
        target = quantized_dir(source) / f"{Path(source).stem}.{quant}.gguf"
        if not target.is_file():
            if bindir is None or not (bindir / "llama-quantize").is_file():
                raise NoLlamaCpp(f"making the {quant} file needs llama-quantize (in the "
                                 f"llama.cpp build: pass --llama-cpp DIR holding it or "
                                 "--build-llama-cpp)")
            target.parent.mkdir(parents=True, exist_ok=True)
            print(f"peers: llama-quantize {source} -> {target} ({quant.upper()})", file=log,
                  flush=True)
            partial = target.with_suffix(".partial")
            cmd = [str(bindir / "llama-quantize"),
                   *(["--allow-requantize"] if have not in FLOAT_TYPES else []),
                   source, str(partial), quant.upper(), str(os.cpu_count() or 1)]
            proc = procs.run(cmd, timeout=CHILD_TIMEOUT)
            if proc.returncode != 0:
                partial.unlink(missing_ok=True)
                raise RuntimeError(f"llama-quantize to {quant.upper()} failed "
                                   f"({proc.returncode}): {proc.stderr[-2000:]}")
            partial.rename(target)
        out.append((quant, str(target)))
    return out

"""Building the CPU decode kernel: the cache (reuse, keys, concurrent first builds from two
processes), the fallback to SDPA when there is no compiler or the build fails, and greedy
tokens against transformers with either path."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aioengine.config import EngineConfig
from aioengine.messages.sampling_params import SamplingParams
from aioengine.worker.attention.cpu_kernel import (
    COMPILER_ENV,
    KernelBuildError,
    PagedDecodeKernel,
    ensure_built,
    select_decode_kernel,
)
from aioengine.worker.model_runner import ModelRunner
from tests.worker.step_driver import StepDriver
from tests.worker.test_model_runner import hf_greedy, hf_model, prompt  # noqa: F401

CC = shutil.which("cc")
# The compilers these tests wrap build at -O0 (the last -O wins): the tests are about the cache,
# not the machine code, and the kernel's -O3 build takes ~9 s of CPU on the 2-core box (-O0:
# ~1.5 s); three tests build it twice each. The result still loads as the kernel.
FAST_CC = f'{CC} "$@" -O0'
needs_cc = pytest.mark.skipif(CC is None, reason="needs a C compiler (cc)")


def wrapper(tmp: Path, name: str, body: str) -> str:
    """A compiler script around the real ``cc``: logs each compile to ``<tmp>/<name>.log``
    (``FAST_CC`` in ``body`` compiles at -O0)."""
    path = tmp / name
    path.write_text(f"#!/bin/sh\ncase \"$1\" in --version) exec {CC} \"$@\";; esac\n"
                    f"echo compile >> {tmp / name}.log\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def compiles(tmp: Path, name: str) -> int:
    log = tmp / f"{name}.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("AIOENGINE_CACHE", str(root))
    return root


@needs_cc
def test_build_is_cached_and_keyed_by_the_compiler(tmp_path, cache):
    cc = wrapper(tmp_path, "cc1", f"exec {FAST_CC}")
    first = ensure_built(cc)
    assert first.parent == cache / "kernels" and compiles(tmp_path, "cc1") == 1
    assert ensure_built(cc) == first and compiles(tmp_path, "cc1") == 1  # reused, not rebuilt
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary left
    PagedDecodeKernel(str(first))  # loads
    # Another compiler version is another key: a new build beside the old one.
    other = tmp_path / "cc2"
    other.write_text(f"#!/bin/sh\ncase \"$1\" in --version) echo other-cc 99;; *) exec "
                     f"{FAST_CC};; esac\n")
    other.chmod(0o755)
    second = ensure_built(str(other))
    assert second != first and second.is_file() and first.is_file()


@needs_cc
def test_compiler_version_runs_once_per_compiler_file(tmp_path, cache):
    """Every kernel load hashes the compiler's version: it is asked once per process and
    compiler file (a model loads one kernel per linear), and again once the file changes."""
    from aioengine.worker.cpu.kernels.build import compiler_version

    compiler_version.cache_clear()
    script = tmp_path / "vcc"

    def write(tag: str) -> None:
        script.write_text(f"#!/bin/sh\ncase \"$1\" in --version) echo v >> {tmp_path}/v.log; "
                          f"echo {tag}; exit 0;; esac\nexec {FAST_CC}\n")
        script.chmod(0o755)

    def versions() -> int:
        return len((tmp_path / "v.log").read_text().splitlines())

    write("cc-one")
    first = ensure_built(str(script))
    assert ensure_built(str(script)) == first and ensure_built(str(script)) == first
    assert versions() == 1
    write("cc-two-longer")  # an upgraded compiler: another size, mtime and version
    second = ensure_built(str(script))
    assert versions() == 2 and second != first
    assert ensure_built(str(script)) == second and versions() == 2


CHILD = """
import sys
from aioengine.worker.attention.cpu_kernel import PagedDecodeKernel, ensure_built
path = ensure_built(sys.argv[1])
PagedDecodeKernel(str(path))
print(path)
"""


@needs_cc
def test_concurrent_first_builds_from_two_processes(tmp_path, cache):
    """Both processes compile at once (the compiler waits until both have started) and each
    publishes its build by rename: both load the same complete file, no temporary is left."""
    sync = tmp_path / "sync"
    sync.mkdir()
    # The barrier waits for the state "both compilers started", up to 1800 rounds (90 s+, a
    # hang guard under communicate's 120 s): two cold interpreters importing torch on a loaded
    # 2-core box can reach the compile far apart (with 20 s the first could build alone).
    cc = wrapper(tmp_path, "slowcc", f'touch {sync}/$$\ni=0\nwhile [ "$(ls {sync} | wc -l)" '
                 f'-lt 2 ] && [ $i -lt 1800 ]; do sleep 0.05; i=$((i+1)); done\nexec {FAST_CC}')
    env = os.environ | {"AIOENGINE_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, cc], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1 and compiles(tmp_path, "slowcc") == 2
    assert [p.name for p in (cache / "kernels").iterdir()] == [Path(paths.pop()).name]


def test_auto_falls_back_to_sdpa_without_a_compiler(cache, monkeypatch, caplog):
    monkeypatch.setenv(COMPILER_ENV, "aioengine-no-such-cc")
    with caplog.at_level(logging.WARNING):
        assert select_decode_kernel("auto", "cpu", torch.float32) is None
    [record] = [r for r in caplog.records if "falls back to torch SDPA" in r.getMessage()]
    assert "no C compiler 'aioengine-no-such-cc' on PATH" in record.getMessage()
    with pytest.raises(KernelBuildError, match="no C compiler 'aioengine-no-such-cc'"):
        select_decode_kernel("kernel", "cpu", torch.float32)


@needs_cc
def test_a_failing_build_is_reported(tmp_path, cache, monkeypatch, caplog):
    cc = wrapper(tmp_path, "badcc", "echo 'badcc: internal error' >&2\nexit 3")
    monkeypatch.setenv(COMPILER_ENV, cc)
    with pytest.raises(KernelBuildError, match="exited with 3: badcc: internal error"):
        select_decode_kernel("kernel", "cpu", torch.float32)
    with caplog.at_level(logging.WARNING):
        assert select_decode_kernel("auto", "cpu", torch.float32) is None
    assert "badcc: internal error" in caplog.text
    assert list((cache / "kernels").iterdir()) == []  # nothing half-written left behind


@needs_cc
def test_an_unwritable_cache_is_reported(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("AIOENGINE_CACHE", str(not_a_dir))
    with pytest.raises(KernelBuildError, match=r"cannot write the kernel under .*file/kernels .*"
                       r"set AIOENGINE_CACHE to a writable directory"):
        ensure_built()
    assert select_decode_kernel("auto", "cpu", torch.float32) is None


def test_selection_by_mode_device_and_dtype(cache, monkeypatch):
    monkeypatch.setenv(COMPILER_ENV, "aioengine-no-such-cc")  # never built below
    assert select_decode_kernel("sdpa", "cpu", torch.float32) is None
    assert select_decode_kernel("kernel", "cpu", torch.bfloat16) is None
    assert select_decode_kernel("kernel", "cuda", torch.float32) is None
    with pytest.raises(ValueError, match="cpu_decode_attention must be one of"):
        select_decode_kernel("fast", "cpu", torch.float32)
    with pytest.raises(ValueError, match=r"cpu_decode_attention must be one of \('auto', "):
        EngineConfig(cpu_decode_attention="fast")


def greedy_run(runner: ModelRunner) -> dict[str, list[int]]:
    """Mixed steps: chunked prefills beside decodes, and two requests whose prompts share two
    blocks (the second's prefill starts after the cached prefix; its decodes read it)."""
    runner.states.clear()
    d = StepDriver(4, 96)
    greedy = SamplingParams(temperature=0.0, max_tokens=64)
    prompts = {"a": prompt(1, 13), "b": prompt(2, 22), "c": prompt(1, 8) + prompt(3, 7)}
    d.add("a", prompts["a"], greedy)
    d.add("b", prompts["b"], greedy)
    d.apply(runner.execute(d.step({"a": 100, "b": 9})))
    d.add("c", prompts["c"], greedy)
    c = d.seqs["c"]
    c.blocks, c.computed = d.seqs["a"].blocks[:2], 8  # a's first two blocks hold c's prefix
    for _ in range(9):
        d.apply(runner.execute(d.step({"a": 1, "b": 9, "c": 5})))
    return {rid: s.outputs for rid, s in d.seqs.items()}


@needs_cc
@pytest.mark.parametrize("mode", ["kernel", "sdpa", "auto-without-compiler"])
def test_greedy_tokens_match_transformers_on_either_path(mode, monkeypatch, hf_model):  # noqa: F811
    if mode == "auto-without-compiler":
        monkeypatch.setenv(COMPILER_ENV, "aioengine-no-such-cc")
    runner = ModelRunner(EngineConfig(model="tiny", block_size=4, num_kv_blocks=96,
                                      cpu_decode_attention=mode.split("-")[0]))
    assert (runner.decode_kernel is not None) == (mode == "kernel")
    runner.allocate_kv_cache(96)
    outs = greedy_run(runner)
    for rid, p in (("a", prompt(1, 13)), ("b", prompt(2, 22)), ("c", prompt(1, 8) + prompt(3, 7))):
        assert len(outs[rid]) >= 5
        assert outs[rid] == hf_greedy(hf_model, p, len(outs[rid])), rid

"""Build C sources once per (sources and headers, flags, compiler, CPU) into the aioengine cache.

The machinery under ``aioengine.worker.cpu.kernels.library``, which names the libraries. A
library's shared object lands in ``$AIOENGINE_CACHE/kernels/<name>-<key>.so``, compiled by one
compiler call over all its ``.c`` files; the key hashes everything that changes the machine
code, so an edited source or header, other flags, another compiler or another CPU (a cache on a
shared home directory) never loads a stale build. Each builder compiles to its own temporary
name and ``os.replace``s it into place: concurrent first builds (TP ranks, parallel tests) each
publish a complete file, and a reader never sees half of one.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from aioengine.config import cache_dir

logger = logging.getLogger(__name__)

COMPILER_ENV = "AIOENGINE_CC"
"""Names the C compiler (looked up on PATH, or a path); default ``cc``."""
DEFAULT_COMPILER = "cc"
BUILD_TIMEOUT = 120.0


class KernelBuildError(RuntimeError):
    """A kernel could not be built here: no compiler, or the compiler failed (its reason in
    the message)."""


def find_compiler(name: str | None = None) -> str:
    """The compiler's path: ``name``, else ``$AIOENGINE_CC``, else ``cc``, looked up on PATH."""
    name = name or os.environ.get(COMPILER_ENV) or DEFAULT_COMPILER
    path = shutil.which(name)
    if path is None:
        raise KernelBuildError(f"no C compiler {name!r} on PATH (set {COMPILER_ENV} to one)")
    return path


@functools.cache
def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.machine() + " " + platform.processor()


@functools.lru_cache(maxsize=16)
def compiler_version(compiler: str, mtime_ns: int, size: int, inode: int) -> str:
    """``compiler --version``, run once per process and compiler file (its identity in the
    arguments: a replaced or edited compiler runs again). A model loads one kernel per linear
    layer: running the compiler for each was a fork per linear and a visible share of a model's
    start-up (docs/benchmarks.md)."""
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"C compiler {compiler} does not run: {e}") from e


def build_key(compiler: str, inputs: Sequence[Path], flags: Sequence[str]) -> str:
    """Hash of the inputs (sources and headers, by name and content), the flags, the compiler's
    version and the CPU's feature flags."""
    try:
        st = os.stat(compiler)
    except OSError as e:
        raise KernelBuildError(f"C compiler {compiler} does not run: {e}") from e
    version = compiler_version(compiler, st.st_mtime_ns, st.st_size, st.st_ino)
    h = hashlib.sha256()
    parts = [part for path in inputs for part in (path.name.encode(), path.read_bytes())]
    for part in (*parts, " ".join(flags).encode(), version.encode(), cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def kernel_dir() -> Path:
    return Path(cache_dir()) / "kernels"


def build_shared(name: str, sources: Sequence[Path], flags: Sequence[str], what: str,
                 compiler_name: str | None = None, headers: Sequence[Path] = ()) -> Path:
    """``sources`` compiled with ``flags`` into ``kernels/<name>-<key>.so`` (built first if no
    build for this key exists; ``headers``, the files they include, are part of the key);
    ``what`` names the library in log lines."""
    compiler = find_compiler(compiler_name)
    target = kernel_dir() / f"{name}-{build_key(compiler, [*sources, *headers], flags)}.so"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
        os.close(fd)
    except OSError as e:
        raise KernelBuildError(f"cannot write the kernel under {target.parent} ({e.strerror}); "
                               "set AIOENGINE_CACHE to a writable directory") from e
    try:
        try:
            proc = subprocess.run([compiler, *flags, "-o", tmp, *map(str, sources)],
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        except (OSError, subprocess.SubprocessError) as e:
            raise KernelBuildError(f"{compiler} failed to run: {e}") from e
        if proc.returncode != 0:
            raise KernelBuildError(f"{compiler} exited with {proc.returncode}: "
                                   f"{proc.stderr.strip()[-2000:]}")
        try:
            os.chmod(tmp, 0o755)  # mkstemp makes it private; the cache is readable like any
            os.replace(tmp, target)
        except OSError as e:
            raise KernelBuildError(f"cannot publish the kernel as {target} ({e})") from e
        logger.info("built the %s: %s", what, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target

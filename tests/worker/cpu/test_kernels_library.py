"""The one build/cache/loader of the worker's C libraries (aioengine.worker.cpu.kernels): every
library's sources are found and its declared functions exist with their signatures set; the
build key covers the headers; the C traits table and Python's QTYPES agree."""

from __future__ import annotations

import ctypes
import re
import shutil
from pathlib import Path

import pytest

from aioengine.worker.cpu.kernels import library
from aioengine.worker.cpu.kernels.build import build_key, find_compiler
from aioengine.worker.quant import QTYPES

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


def test_every_library_has_its_sources_and_headers() -> None:
    for lib in library.LIBRARIES.values():
        assert lib.sources, lib.name
        assert all(p.parent == library.ROOT / lib.folder for p in lib.sources)
        folders = {library.ROOT / f for f in (lib.folder, *lib.shared)}
        assert all(p.parent in folders for p in lib.headers)
        # every header a source includes with quotes is one of the library's headers (its own
        # or a shared folder's), so an edit to it changes the build key
        own = {p.resolve() for p in lib.headers}
        for src in lib.sources + lib.headers:
            for inc in re.findall(r'#include "([^"]+)"', src.read_text()):
                assert (src.parent / inc).resolve() in own, \
                    f"{src.name} includes {inc}, not a header of {lib.name}"


def test_the_key_covers_headers_and_flags(tmp_path: Path) -> None:
    cc = find_compiler()
    src, hdr = tmp_path / "a.c", tmp_path / "a.h"
    src.write_text('#include "a.h"\n')
    hdr.write_text("#define X 1\n")
    first = build_key(cc, [src, hdr], ["-O2"])
    assert build_key(cc, [src, hdr], ["-O2"]) == first
    assert build_key(cc, [src, hdr], ["-O3"]) != first
    hdr.write_text("#define X 2\n")
    assert build_key(cc, [src, hdr], ["-O2"]) != first


@needs_cc
@pytest.mark.parametrize("name", sorted(library.LIBRARIES))
def test_each_library_loads_with_its_signatures(name: str) -> None:
    lib = library.LIBRARIES[name]
    cdll = library.load(lib)
    assert library.load(lib) is cdll  # opened once per process
    for fn_name, (restype, argtypes) in lib.functions:
        fn = getattr(cdll, fn_name)
        assert fn.restype is restype and tuple(fn.argtypes) == argtypes, fn_name
        assert library.fn_address(fn)


@needs_cc
def test_the_traits_table_matches_qtypes() -> None:
    cdll = library.load(library.QUANT)
    info = (ctypes.c_int64 * 3)()
    for q in QTYPES.values():
        assert cdll.qk_type_info(q.ggml_id, info) == 0, q.name
        assert (info[0], info[1]) == (q.block, q.bytes), q.name
        assert info[2] > 0  # every type the kernels compute has an x8 layout
    for unknown in (-1, 0, 1, 20, 99, 1 << 20):  # 20: IQ4_NL
        assert cdll.qk_type_info(unknown, info) == -1  # E_TYPE

"""The worker's GGUF reader skips array fields (the tokenizer's) and reads tensors exactly as
``gguf.GGUFReader`` does, on a real file written by ``gguf.GGUFWriter``."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from aioengine.worker.loader.gguf_weights import tensors_reader


def test_tensors_and_scalars_match_the_stock_reader(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_token_list(["<s>", "hello", "wörld", ""] * 50)
    w.add_token_types([1, 2, 3, 4] * 50)
    w.add_array("test.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("b.weight", rng.standard_normal((7,)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    fast, stock = tensors_reader(str(path)), gguf.GGUFReader(str(path))
    assert list(fast.fields) == list(stock.fields)
    for name in ("general.architecture", "llama.block_count", "llama.rope.freq_base"):
        assert fast.fields[name].contents() == stock.fields[name].contents()
    assert fast.fields["tokenizer.ggml.tokens"].contents() == []  # skipped, not parsed
    assert fast.fields["test.nested"].types == stock.fields["test.nested"].types
    assert [(t.name, t.tensor_type, t.data_offset) for t in fast.tensors] == \
        [(t.name, t.tensor_type, t.data_offset) for t in stock.tensors]
    for a, b in zip(fast.tensors, stock.tensors, strict=True):
        np.testing.assert_array_equal(a.data, b.data)

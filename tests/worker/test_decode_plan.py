"""The decode plan (a step's layers in one C call, ``aioengine.worker.cpu.decode_plan``) against
the per-layer loop it replaces: the same compiled ops in the same order, so bit-equal logits."""

from __future__ import annotations

import shutil

import pytest
import torch

from aioengine.worker import gemv
from aioengine.worker import threads as threads_mod
from aioengine.worker.attention.cpu_kernel import load_decode_kernel
from aioengine.worker.cpu.decode_plan import DecodePlan
from aioengine.worker.ops.plan import PlanError, error_text
from tests.worker.cpu_load import load_model
from tests.worker.driver import Driver
from tests.worker.hf_models import make_hf_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


@pytest.fixture(autouse=True)
def _f32_gemv():
    """The F32 GEMV on, as a CPU float32 worker configures it (the plan runs float linears
    only through it)."""
    old = gemv.threads()
    assert gemv.configure("cpu", torch.float32, old)
    yield
    gemv.set_threads(old)


def _schedule(model, cfg, kv_dtype=None, decode_kernel=True, block_size=4) -> Driver:
    """Two sequences decoding together (T=2), a mixed prefill+decode step (the loop's), then
    three decoding together (T=3)."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
               for n in (11, 3, 25)]
    d = Driver(model, cfg, block_size=block_size,
               decode_kernel=load_decode_kernel() if decode_kernel else None, kv_dtype=kv_dtype)
    for p in prompts[:2]:
        d.add(p)
    d.step([(0, 11), (1, 3)])
    d.decode_all(3)
    d.add(prompts[2])
    d.step([(2, 9), (0, 1), (1, 1)])  # a prefill chunk with decodes: mixed step
    d.step([(2, 16)])
    d.decode_all(5)
    d2 = d.add(prompts[0][:5])  # and one sequence alone (T=1)
    d.step([(d2, 5)])
    for _ in range(3):
        d.step([(d2, 1)])
    return d


def _both(model, cfg, monkeypatch, threads: int, **kw) -> tuple[Driver, Driver]:
    monkeypatch.setattr(threads_mod, "_kernel_threads", None)  # torch's count, set below
    old_torch, old_gemv = torch.get_num_threads(), gemv.threads()
    torch.set_num_threads(threads)
    gemv.set_threads(threads)
    try:
        monkeypatch.setattr(model.cpu_path, "plan", True)
        fast = _schedule(model, cfg, **kw)
        monkeypatch.setattr(model.cpu_path, "plan", False)
        slow = _schedule(model, cfg, **kw)
        monkeypatch.setattr(model.cpu_path, "plan", True)
    finally:
        torch.set_num_threads(old_torch)
        gemv.set_threads(old_gemv)
    return fast, slow


def _assert_equal(fast: Driver, slow: Driver) -> None:
    for a, b in zip(fast.seqs, slow.seqs, strict=True):
        assert a.tokens == b.tokens
        assert a.logits.keys() == b.logits.keys()
        for p, logits in a.logits.items():
            assert torch.equal(logits, b.logits[p]), p


@pytest.mark.parametrize("variant", ["llama3-tied", "phi3", "mistral"])
@pytest.mark.parametrize("quantization", [None, "q8_0", "q4_1"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kv_dtype", [None, torch.float16])
def test_plan_equals_the_loop(tmp_path, monkeypatch, variant, quantization, threads, kv_dtype):
    make_hf_model(variant, str(tmp_path), seed=11)
    model, cfg = load_model(str(tmp_path), dtype="float32", device="cpu",
                            quantization=quantization)
    path = model.cpu_path
    assert path is not None
    fast, slow = _both(model, cfg, monkeypatch, threads, kv_dtype=kv_dtype)
    plan = path._plan
    assert isinstance(plan, DecodePlan), plan
    # the decode steps of both drivers' schedules: 3 + 5 + 3 per schedule, the plan ran the
    # first schedule's (mistral: every layer windowed, the windowed metadata)
    assert plan.runs == 11
    _assert_equal(fast, slow)


def test_no_plan_without_the_decode_kernel(tmp_path, monkeypatch):
    """Decode attention by torch SDPA (no compiled kernel in the metadata): the loop runs."""
    make_hf_model("llama3-tied", str(tmp_path), seed=3)
    model, cfg = load_model(str(tmp_path), dtype="float32", device="cpu")
    fast, slow = _both(model, cfg, monkeypatch, 1, decode_kernel=False)
    plan = model.cpu_path._plan
    assert isinstance(plan, DecodePlan) and plan.runs == 0
    _assert_equal(fast, slow)


def test_mixed_windowed_layers_have_no_plan(tmp_path, monkeypatch):
    """qwen2 with max_window_layers: layer 0 full, the rest windowed: two metadata per step."""
    make_hf_model("qwen2-window", str(tmp_path), seed=3)
    model, cfg = load_model(str(tmp_path), dtype="float32", device="cpu")
    fast, slow = _both(model, cfg, monkeypatch, 1)
    reason = model.cpu_path._plan
    assert isinstance(reason, tuple) and "sliding-window" in reason[0]
    _assert_equal(fast, slow)


def test_plan_rebuilt_for_new_caches_and_weight_layouts(tmp_path, monkeypatch):
    make_hf_model("llama3-tied", str(tmp_path), seed=5)
    model, cfg = load_model(str(tmp_path), dtype="float32", device="cpu", quantization="q4_1")
    path = model.cpu_path
    first = _schedule(model, cfg)
    plan = path._plan
    assert isinstance(plan, DecodePlan) and plan.runs == 11
    second = _schedule(model, cfg)  # a new Driver: new KV cache tensors
    assert path._plan is not plan and path._plan.runs == 11
    _assert_equal(first, second)
    # the weights back in the file's row layout (a new policy): the plan follows them
    import dataclasses

    plan = path._plan
    for m in model.modules():
        qw = getattr(m, "qweight", None)
        if qw is not None:
            qw.policy = dataclasses.replace(qw.policy, x8=False)
    rows = _schedule(model, cfg)
    assert path._plan is not plan and isinstance(path._plan, DecodePlan)
    monkeypatch.setattr(model.cpu_path, "plan", False)
    rows_loop = _schedule(model, cfg)
    _assert_equal(rows, rows_loop)


def test_bad_inputs_are_refused_by_name(tmp_path):
    make_hf_model("llama3-tied", str(tmp_path), seed=5)
    model, cfg = load_model(str(tmp_path), dtype="float32", device="cpu")
    d = _schedule(model, cfg)
    plan = model.cpu_path._plan
    assert isinstance(plan, DecodePlan)
    # a KV slot outside the cache: rope/KV write of layer 0 says so
    d2 = d.add([1, 2, 3])
    d.step([(d2, 3)])
    seq = d.seqs[d2]
    orig = d.caches
    d.caches = [c[:, :, :1].contiguous() for c in orig]  # caches of one block
    with pytest.raises(PlanError, match="layer 0, rope/KV write: a KV slot is outside the "
                                        "cache"):
        d.step([(d2, 1)])
    d.caches = orig
    assert seq is d.seqs[d2]
    with pytest.raises(PlanError, match="hidden states of 8 values"):
        plan.run(torch.zeros(1, 8), torch.zeros(1, 4), torch.zeros(1, 4), _meta(d, d2), None,
                 d.caches)
    assert "layer 2, attention: a block id is outside the KV cache" in error_text(-2, 2 * 16 + 3)
    assert "layer 0, qkv: bad shape" in error_text(-2, 1)
    assert "layer 1, down" in error_text(-101, 16 + 8)


def _meta(d: Driver, i: int):
    from aioengine.worker.attention import build_attention_metadata

    s = d.seqs[i]
    return build_attention_metadata([(len(s.tokens) - 1, 1, s.blocks)], d.block_size,
                                    decode_kernel=d.decode_kernel)


def test_many_sequences_with_x8_weights(tmp_path, monkeypatch):
    """x8 weights take any M through the kernels (``_Plan.any_m``): 17 sequences decoding
    together still run the plan, bit-equal to the loop; float32 weights above the GEMV's
    8 rows do not (torch's GEMM in the loop). Two kernel threads and 4 kv heads: the plan's
    attention splits 68 (sequence, kv head) pairs over the pool, two pairs a chunk."""
    make_hf_model("llama3-tied", str(tmp_path), seed=7, num_key_value_heads=4)
    monkeypatch.setattr(threads_mod, "_kernel_threads", 2)
    gen = torch.Generator().manual_seed(2)

    def run(model, cfg) -> Driver:
        d = Driver(model, cfg, block_size=4, decode_kernel=load_decode_kernel())
        for _ in range(17):
            d.add(torch.randint(0, cfg.vocab_size, (5,), generator=gen).tolist())
        d.step([(i, 5) for i in range(17)])
        d.decode_all(3)
        return d

    for quantization, runs in (("q8_0", 3), (None, 0)):
        model, cfg = load_model(str(tmp_path), dtype="float32", device="cpu",
                                quantization=quantization)
        monkeypatch.setattr(model.cpu_path, "plan", True)
        fast = run(model, cfg)
        plan = model.cpu_path._plan
        assert isinstance(plan, DecodePlan) and plan.runs == runs, quantization
        monkeypatch.setattr(model.cpu_path, "plan", False)
        gen.manual_seed(2)
        slow = run(model, cfg)
        gen.manual_seed(2)
        _assert_equal(fast, slow)


def test_op_times(tmp_path):
    make_hf_model("llama3-tied", str(tmp_path), seed=5)
    model, cfg = load_model(str(tmp_path), dtype="float32", device="cpu", quantization="q8_0")
    _schedule(model, cfg)
    plan = model.cpu_path._plan
    with pytest.raises(RuntimeError, match="without profile"):
        plan.op_times()
    d = _schedule(model, cfg)
    plan = model.cpu_path._plan
    plan.profile()
    import time

    t0 = time.perf_counter()
    d.decode_all(4)
    wall = time.perf_counter() - t0
    times = plan.op_times()
    assert set(times) == {"input norm", "qkv", "rope/KV write", "attention", "o_proj",
                          "post-attention norm", "gate_up", "SiLU*up", "down", "next norm",
                          "LM head"}
    # the Driver runs the model's forward (the module path): the LM head is not the plan's
    assert times.pop("LM head") == 0
    assert all(v > 0 for v in times.values()), times
    assert sum(times.values()) < wall
    plan.profile(False)
    d.decode_all(1)
    with pytest.raises(RuntimeError):
        plan.op_times()


def test_attention_by_head_ranges_equals_one_call():
    """``paged_decode_attention_heads``: kv heads h0..h1-1 computed as the whole call computes
    them; an empty or outside range is refused (nothing written)."""
    import ctypes

    kernel = load_decode_kernel()
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, bs, nb = 6, 3, 16, 4, 5
    q = torch.randn(2, hq, d, generator=gen)
    cache = torch.randn(2, hkv, nb, bs, d, generator=gen)
    tables = torch.tensor([[3, 1, 4], [0, 2, 0]])
    lens = torch.tensor([10, 7])
    whole = kernel(q, cache, tables, lens, 0.25, torch.empty(2, hq, d))
    bound = kernel.prepare(q, cache, tables, lens, 0.25, torch.empty(2, hq, d))
    a = bound.args
    fn = kernel.heads_fn
    fn.restype = ctypes.c_int
    i64, p = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = (p, i64, p, i64, p, p, p, p, p, i64, i64, i64, i64, i64, i64, i64,
                   ctypes.c_float, i64, i64)
    out = torch.zeros(2, hq, d)

    def call(h0, h1):
        return fn(q.data_ptr(), a[0], a[1], a[2], cache.data_ptr(), a[3], a[4], a[5],
                  out.data_ptr(), *a[6:], h0, h1)

    for h0, h1 in ((0, 0), (2, 1), (-1, 1), (2, 4)):
        assert call(h0, h1) == -4  # bad head counts or sizes
    assert torch.equal(out, torch.zeros_like(out))
    for h in range(hkv):
        assert call(h, h + 1) == 0
    assert torch.equal(out, whole)


@pytest.mark.parametrize("variant", ["llama3-tied", "qwen2-window"])
def test_prefill_through_the_gemv_kernel_matches_torchs_gemm(tmp_path, monkeypatch, variant):
    """With more kernel threads than torch's, every row count of a float linear takes the
    kernel (prefill chunks, mixed steps): the same tokens as torch's GEMM, logits equal to
    float rounding."""
    make_hf_model(variant, str(tmp_path), seed=5)
    model, cfg = load_model(str(tmp_path), dtype="float32", device="cpu")
    monkeypatch.setattr(threads_mod, "_kernel_threads", None)
    old_torch, old_gemv = torch.get_num_threads(), gemv.threads()
    torch.set_num_threads(1)
    try:
        gemv.set_threads(1)
        assert gemv.max_kernel_rows() == gemv.MAX_ROWS
        torchs = _schedule(model, cfg)
        gemv.set_threads(2)
        assert gemv.max_kernel_rows() > 1 << 30
        kernels = _schedule(model, cfg)
    finally:
        torch.set_num_threads(old_torch)
        gemv.set_threads(old_gemv)
    for a, b in zip(kernels.seqs, torchs.seqs, strict=True):
        assert a.tokens == b.tokens
        assert a.logits.keys() == b.logits.keys()
        for p, logits in a.logits.items():
            torch.testing.assert_close(logits, b.logits[p], rtol=1e-4, atol=1e-4)

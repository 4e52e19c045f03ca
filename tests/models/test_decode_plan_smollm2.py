"""SmolLM2 Q4_1 (blocks kept quantized) with decode steps run by the decode plan (one C call
per step for every layer): logits bit-equal to the per-layer loop's at 1 and 2 threads, one
sequence and three decoding together."""

from __future__ import annotations

import shutil

import pytest
import torch

from aioengine.client.tokenizer import Tokenizer
from aioengine.worker import gemv
from aioengine.worker import threads as threads_mod
from aioengine.worker.attention.cpu_kernel import load_decode_kernel
from aioengine.worker.cpu.decode_plan import DecodePlan
from tests.models.conftest import PROMPTS
from tests.worker.cpu_load import load_model
from tests.worker.driver import Driver

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


@pytest.fixture(scope="module")
def quantized(smollm2_file: str):
    return load_model(smollm2_file, dtype="float32", device="cpu", quantization="gguf")


def _run(model, spec, prompts: list[list[int]], steps: int) -> Driver:
    d = Driver(model, spec, block_size=16, num_blocks=64, decode_kernel=load_decode_kernel())
    for p in prompts:
        d.add(p)
    d.step([(i, len(p)) for i, p in enumerate(prompts)])
    d.decode_all(steps)
    return d


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
def test_plan_logits_equal_the_loop(smollm2, quantized, monkeypatch, threads, batch) -> None:
    model, spec = quantized
    monkeypatch.setattr(threads_mod, "_kernel_threads", None)  # torch's count, set below
    tok = Tokenizer.from_dir(smollm2.tokenizer_path)
    prompts = [tok.encode(p) for p in PROMPTS[:batch]]
    old_torch, old_gemv = torch.get_num_threads(), gemv.threads()
    torch.set_num_threads(threads)
    try:
        monkeypatch.setattr(model.cpu_path, "plan", True)
        fast = _run(model, spec, prompts, 6)
        plan = model.cpu_path._plan
        assert isinstance(plan, DecodePlan), plan
        runs = plan.runs
        monkeypatch.setattr(model.cpu_path, "plan", False)
        slow = _run(model, spec, prompts, 6)
    finally:
        torch.set_num_threads(old_torch)
        gemv.set_threads(old_gemv)
    assert plan.runs == runs >= 6
    for a, b in zip(fast.seqs, slow.seqs, strict=True):
        assert a.tokens == b.tokens
        for p, logits in a.logits.items():
            assert torch.equal(logits, b.logits[p]), p

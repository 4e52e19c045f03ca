"""SmolLM2's Q4_1 blocks kept quantized (``quantization="gguf"``: our kernels, int16
activations): the same answers as the dequantized model on the real-model chat checks, logits
within a stated tolerance of the float32 model's, and the same with tensor-parallel shards."""

from __future__ import annotations

import shutil

import pytest
import torch

from aioengine import LLM, EngineConfig, SamplingParams
from aioengine.client.tokenizer import Tokenizer
from tests.models.conftest import PROMPTS
from tests.smollm2 import SMOLLM2
from tests.worker.cpu_load import load_model
from tests.worker.driver import Driver

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
QUESTIONS = ["What is the capital of France?", "What is 2 + 2?", "Name three primary colors.",
             "Translate 'good morning' to Spanish.", "Who wrote Romeo and Juliet?"]


def chat_answers(**config) -> list[str]:
    with LLM(EngineConfig(model=SMOLLM2, max_model_len=512, max_num_seqs=len(QUESTIONS),
                              **config)) as llm:
        outs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS], GREEDY,
                        use_tqdm=False)
    return [o.text for o in outs]


def test_chat_answers_equal_the_dequantized_model() -> None:
    float_answers = chat_answers(quantization="none")
    assert float_answers[0] == "The capital of France is Paris."
    assert chat_answers() == float_answers  # the default, "auto", keeps the blocks
    assert chat_answers(quantization="gguf", quant_activations="float32") == float_answers


def prompt_logits(smollm2, smollm2_file: str, quantization: str | None) -> torch.Tensor:
    """Logits of the France chat prompt and of 8 greedy tokens after it."""
    model, spec = load_model(smollm2_file, dtype="float32", device="cpu",
                             quantization=quantization)
    ids = Tokenizer.from_dir(smollm2.tokenizer_path).encode(PROMPTS[0])
    d = Driver(model, spec, block_size=16)
    d.add(ids)
    d.step([(0, len(ids))])
    d.decode_all(8)
    seq = d.seqs[0]
    return torch.stack([seq.logits[p] for p in sorted(seq.logits)])


def test_logits_within_tolerance_of_the_float_model(smollm2, smollm2_file: str) -> None:
    """The quantized path moves no logit by more than 0.05 (measured 0.007; logits reach
    about 38): only the 16-bit activations and the order of float sums differ from the
    dequantized model."""
    ref = prompt_logits(smollm2, smollm2_file, None)
    got = prompt_logits(smollm2, smollm2_file, "gguf")
    diff = (got - ref).abs().max().item()
    assert 0 < diff < 0.05
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_tensor_parallel_quantized_shards_answer_the_same() -> None:
    """SmolLM2's 9 heads split over 3 ranks; every row-parallel split (576/3, 1536/3 inputs)
    falls on 32-value block boundaries, so each rank keeps its blocks unchanged."""
    assert chat_answers(quantization="gguf", tensor_parallel_size=3, executor="mp")[:1] == [
        "The capital of France is Paris."]


def test_auto_keeps_the_blocks_of_a_quantized_file_on_cpu_in_float32(smollm2_file: str,
                                                                      tmp_path) -> None:
    """``quantization="auto"`` (the default) keeps a GGUF file's blocks where our kernels
    compute them (CPU, float32); a float-only file, another dtype or device loads floats."""
    import gguf
    import numpy as np

    from aioengine.worker.loader.gguf_weights import kernel_block_types, tensors_reader
    from aioengine.worker.loader.load import auto_quantization

    cpu = torch.device("cpu")
    reader = tensors_reader(smollm2_file)
    assert kernel_block_types(reader) == ["q4_1", "q8_0"]
    assert auto_quantization(reader, cpu, torch.float32) == "gguf"
    assert auto_quantization(reader, cpu, torch.bfloat16) is None
    assert auto_quantization(reader, torch.device("cuda"), torch.float32) is None
    assert auto_quantization(None, cpu, torch.float32) is None  # not a GGUF file
    path = str(tmp_path / "float.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.ones((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert kernel_block_types(tensors_reader(path)) == []
    assert auto_quantization(tensors_reader(path), cpu, torch.float32) is None
    auto, _ = load_model(smollm2_file, dtype="float32", device="cpu", quantization="auto")
    qweight = auto.layers[0].mlp.gate_up_proj.qweight
    assert qweight is not None and qweight.segments[0].qtype.name == "q4_1"
    none, _ = load_model(smollm2_file, dtype="float32", device="cpu", quantization="none")
    assert none.layers[0].mlp.gate_up_proj.qweight is None

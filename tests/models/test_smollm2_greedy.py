"""Real weights end to end: our engine's greedy tokens on SmolLM2 equal transformers' on the
same GGUF file, through every client, transport and tensor-parallel size."""

from __future__ import annotations

import os

import anyio
import pytest

from aioengine import LLM, AsyncMPClient, EngineConfig, SamplingParams
from aioengine.client.tokenizer import Tokenizer
from aioengine.hub import ResolvedModel, read_model_info
from tests.models.conftest import NEW_TOKENS, PROMPTS
from tests.smollm2 import SMOLLM2

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)


def test_host_tokenizer_matches_transformers(smollm2: ResolvedModel, hf_smollm2) -> None:
    _, hf_tok = hf_smollm2
    ours = Tokenizer.from_dir(smollm2.tokenizer_path)
    for text in [*PROMPTS, "Grüße, 世界! 🙂 \n\t  spaces", ""]:
        assert ours.encode(text) == hf_tok(text).input_ids, text
    info = read_model_info(smollm2.model_path)
    assert info.eos_token_ids == [2] and info.architectures == ["LlamaForCausalLM"]
    assert info.chat_template is not None and "<|im_start|>" in info.chat_template


def test_llm_greedy_equals_transformers(hf_greedy: dict[str, list[int]]) -> None:
    # transformers computes with the dequantized weights: so do we ("none"; the kept blocks
    # are held to a tolerance in test_smollm2_quantized.py)
    with LLM(EngineConfig(model=SMOLLM2, max_model_len=1024, quantization="none",
                          max_num_seqs=len(PROMPTS))) as llm:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert list(out.token_ids) == hf_greedy[prompt], prompt
    assert outs[0].text.strip() == "The capital of France is Paris."


async def _stream_all(config: EngineConfig) -> list[list[int]]:
    results: list[list[int]] = [[] for _ in PROMPTS]
    async with AsyncMPClient(config) as client:
        async def one(i: int) -> None:
            async for out in client.generate(PROMPTS[i], GREEDY):
                results[i].extend(out.delta_token_ids)
        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(one, i)
    return results


# SmolLM2-135M has 9 query and 3 kv heads: tensor parallelism splits it over 3 ranks, not 2.
@pytest.mark.parametrize(("transport", "executor", "tp"), [
    ("shm", "uniproc", 1), ("zmq", "mp", 1), ("uds", "uniproc", 1), ("shm", "mp", 3)])
def test_async_client_greedy_equals_transformers(transport: str, executor: str, tp: int,
                                                 hf_greedy: dict[str, list[int]]) -> None:
    config = EngineConfig(model=SMOLLM2, transport=transport, executor=executor,
                          tensor_parallel_size=tp, max_model_len=1024, quantization="none",
                          max_num_seqs=len(PROMPTS))  # the KV pool: 4 sequences, not 256
    got = anyio.run(_stream_all, config)
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        assert tokens == hf_greedy[prompt], (transport, executor, tp, prompt)


def test_hf_directory_from_the_gguf_gives_the_same_tokens(tmp_path, hf_smollm2,
                                                          hf_greedy: dict[str, list[int]]) -> None:
    """The dequantized weights saved by transformers as an HF directory load the same."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    model, tok = hf_smollm2
    out = str(tmp_path / "smollm2-hf")
    # transformers refuses to save a model it read from GGUF: copy the weights into a plain one.
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    assert os.path.isfile(os.path.join(out, "tokenizer.json"))
    with LLM(EngineConfig(model=out, max_model_len=1024)) as llm:
        outs = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    for prompt, got in zip(PROMPTS[:2], outs, strict=True):
        assert list(got.token_ids) == hf_greedy[prompt]

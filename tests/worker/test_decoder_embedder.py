"""A decoder embedder (Qwen3-Embedding's layout: a causal model with sentence-transformers'
files asking for last-token pooling, normalized) pools in the ModelRunner, beside generation
in the same step; the reference is transformers' last hidden state on the same random
weights."""

from __future__ import annotations

import json
import os

import torch

from aioengine.config import EngineConfig
from aioengine.hub import read_model_info
from aioengine.messages.sampling_params import SamplingParams
from aioengine.messages.worker_io import NewSequence, ScheduledChunk, StepInput
from aioengine.worker.model_runner import ModelRunner
from tests.worker.hf_models import make_hf_model

BLOCK = 4


def _write_sentence_transformers(path: str) -> None:
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(path, "1_Pooling"))
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 64, "pooling_mode_lasttoken": True,
                   "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": False}, f)


def test_last_token_pooling_beside_generation(tmp_path):
    path = str(tmp_path)
    hf = make_hf_model("qwen3", path, seed=3)
    _write_sentence_transformers(path)
    assert read_model_info(path).task == "embed"
    runner = ModelRunner(EngineConfig(model=path, device="cpu", dtype="float32",
                                      block_size=BLOCK, quantization="none"))
    runner.allocate_kv_cache(64)
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (9, 5)]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    new = [NewSequence(f"e{i}", x, [], params) for i, x in enumerate(inputs)]
    new.append(NewSequence("g", [7, 8, 9], [], params))
    chunks = [ScheduledChunk("e0", inputs[0], 0, [0, 1, 2], False, True),
              ScheduledChunk("g", [7, 8, 9], 0, [3], True),
              ScheduledChunk("e1", inputs[1], 0, [4, 5], False, True)]
    out = runner.execute(StepInput(1, new, chunks, []))
    assert [s.request_id for s in out.sampled] == ["g"]
    with torch.no_grad():
        assert out.sampled[0].token_id == int(hf(torch.tensor([[7, 8, 9]])).logits[0, -1]
                                              .argmax())
    assert [p.request_id for p in out.pooled] == ["e0", "e1"]
    for x, pooled in zip(inputs, out.pooled, strict=True):
        with torch.no_grad():
            last = hf.model(torch.tensor([x])).last_hidden_state[0, -1]
        expected = torch.nn.functional.normalize(last, dim=0)
        torch.testing.assert_close(torch.tensor(pooled.embedding), expected, atol=1e-4,
                                   rtol=1e-4)

"""The loader: sharded checkpoints, dummy weights, and a clear error for each bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config

from aioengine.worker.loader import read_model_spec, resolve_device, resolve_dtype
from aioengine.worker.models import SUPPORTED_ARCHITECTURES, build_model
from tests.worker.cpu_load import load_model
from tests.worker.driver import Driver
from tests.worker.hf_models import make_hf_model


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen2"))
    hf = make_hf_model("qwen2", path, seed=1)
    return path, hf


def _logits(model, cfg, prompt):
    d = Driver(model, cfg, block_size=8)
    d.add(prompt)
    d.step([(0, len(prompt))])
    return torch.stack(list(d.seqs[0].logits.values()))


def _copy(src: str, dst) -> str:
    out = str(dst / "model")
    shutil.copytree(src, out)
    return out


def test_sharded_checkpoint_loads_the_same(qwen_dir, tmp_path):
    path, hf = qwen_dir
    sharded = str(tmp_path / "sharded")
    hf.save_pretrained(sharded, max_shard_size="40KB")
    files = os.listdir(sharded)
    assert "model.safetensors.index.json" in files
    assert sum(f.endswith(".safetensors") for f in files) > 2
    one, cfg = load_model(path, dtype="float32", device="cpu")
    many, _ = load_model(sharded, dtype="float32", device="cpu")
    for (name, a), (_, b) in zip(one.state_dict().items(), many.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    prompt = list(range(1, 20))
    torch.testing.assert_close(_logits(one, cfg, prompt), _logits(many, cfg, prompt))


def test_missing_shard_listed_in_index(qwen_dir, tmp_path):
    _, hf = qwen_dir
    sharded = str(tmp_path / "sharded")
    hf.save_pretrained(sharded, max_shard_size="40KB")
    victim = sorted(f for f in os.listdir(sharded) if f.endswith(".safetensors"))[1]
    os.remove(os.path.join(sharded, victim))
    with pytest.raises(FileNotFoundError, match=f"shard '{victim}' listed in .* does not exist"):
        load_model(sharded, dtype="float32", device="cpu")


def test_missing_path():
    with pytest.raises(FileNotFoundError, match=r"neither a built-in model .* nor an existing "
                                                r"directory"):
        load_model("/nonexistent/model-dir", device="cpu")


def test_no_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json in model directory"):
        load_model(str(tmp_path), device="cpu")


def test_no_weights(qwen_dir, tmp_path):
    out = str(tmp_path)
    shutil.copy(os.path.join(qwen_dir[0], "config.json"), out)
    with pytest.raises(FileNotFoundError, match=r"no safetensors weights .* load_format='dummy'"):
        load_model(out, device="cpu")


def _rewrite(path: str, change) -> None:
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def test_unexpected_tensors_are_named(qwen_dir, tmp_path):
    out = _copy(qwen_dir[0], tmp_path)

    def add(t):
        t["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
        t["model.visual.patch.weight"] = torch.zeros(2)

    _rewrite(out, add)
    with pytest.raises(ValueError, match=r"2 unexpected tensor\(s\) for a qwen2 model: "
                                         r"model.layers.0.mlp.extra_proj.weight, model.visual"):
        load_model(out, dtype="float32", device="cpu")


def test_missing_tensors_are_named(qwen_dir, tmp_path):
    out = _copy(qwen_dir[0], tmp_path)
    _rewrite(out, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\): "
                                         r"model.layers.1.mlp.down_proj.weight"):
        load_model(out, dtype="float32", device="cpu")


def test_shape_mismatch_names_tensor_and_shapes(qwen_dir, tmp_path):
    out = _copy(qwen_dir[0], tmp_path)
    name = "model.layers.0.self_attn.k_proj.weight"
    _rewrite(out, lambda t: t.__setitem__(name, torch.zeros(15, 64)))
    with pytest.raises(ValueError, match=rf"shape mismatch for weight '{name}': "
                                         r"expected \(16, 64\), got \(15, 64\)"):
        load_model(out, dtype="float32", device="cpu")


def test_unsupported_architecture_names_supported_ones(tmp_path):
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"])
    config.save_pretrained(str(tmp_path))
    supported = sorted(SUPPORTED_ARCHITECTURES)
    assert {"LlamaForCausalLM", "Qwen3MoeForCausalLM"} <= set(supported)
    with pytest.raises(ValueError, match=r"unsupported model architecture \['GPT2LMHeadModel'\]"
                                         r"; supported: " + re.escape(str(supported))):
        load_model(str(tmp_path), device="cpu", load_format="dummy")


def _edit_config(path: str, **changes) -> None:
    file = os.path.join(path, "config.json")
    with open(file) as f:
        data = json.load(f)
    data.update(changes)
    with open(file, "w") as f:
        json.dump(data, f)


def test_unsupported_features(qwen_dir, tmp_path):
    out = _copy(qwen_dir[0], tmp_path)
    _edit_config(out, use_sliding_window=True, sliding_window=16, layer_types=["full"] * 2)
    with pytest.raises(ValueError, match=r"'layer_types' must list 2 of \['full_attention', "
                                         r"'sliding_attention'\], got \['full', 'full'\]"):
        load_model(out, device="cpu")
    _edit_config(out, use_sliding_window=False, hidden_act="gelu")
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        load_model(out, device="cpu")
    _edit_config(out, hidden_act="silu", rope_scaling={"rope_type": "yarn", "factor": 4.0},
                 rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    with pytest.raises(ValueError, match="rope type 'yarn' is not supported; supported: "
                                         r"\['default', 'linear', 'llama3', 'longrope'\]"):
        load_model(out, device="cpu")


def test_dummy_weights_are_seeded_and_finite(qwen_dir):
    path = qwen_dir[0]
    a, cfg = load_model(path, dtype="float32", device="cpu", load_format="dummy", seed=5)
    b, _ = load_model(path, dtype="float32", device="cpu", load_format="dummy", seed=5)
    c, _ = load_model(path, dtype="float32", device="cpu", load_format="dummy", seed=6)
    wa, wb, wc = (m.layers[0].mlp.down_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert 0.01 < float(wa.std()) < 0.03
    assert torch.equal(a.norm.weight, torch.ones_like(a.norm.weight))
    assert torch.isfinite(_logits(a, cfg, list(range(30)))).all()


def test_bad_arguments(qwen_dir):
    path = qwen_dir[0]
    with pytest.raises(ValueError, match="load_format must be one of"):
        load_model(path, load_format="pickle")
    with pytest.raises(ValueError, match="load_format 'gguf' needs a GGUF file"):
        load_model(path, load_format="gguf", device="cpu")
    with pytest.raises(ValueError, match="dtype must be 'auto' or one of"):
        load_model(path, dtype="int8", device="cpu")
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu' or 'cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            resolve_device("cuda")


def test_auto_dtype(qwen_dir, tmp_path):
    spec = read_model_spec(qwen_dir[0])
    assert resolve_dtype("auto", spec, torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", spec, torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("auto", spec, torch.device("cuda")) == torch.float32  # as saved
    for key in ("dtype", "torch_dtype", None):  # transformers 5 and 4 spellings, and none
        out = _copy(qwen_dir[0], tmp_path / str(key))
        _edit_config(out, dtype=None)
        if key is None:
            assert resolve_dtype("auto", read_model_spec(out), torch.device("cuda")) == \
                torch.bfloat16
            continue
        _edit_config(out, **{key: "float16"})
        spec = read_model_spec(out)
        assert spec.checkpoint_dtype == "float16"
        assert resolve_dtype("auto", spec, torch.device("cuda")) == torch.float16
        assert resolve_dtype("auto", spec, torch.device("cpu")) == torch.float32


def test_tensor_parallel_shapes_must_divide(qwen_dir):
    cfg = read_model_spec(qwen_dir[0])
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) must be divisible by "
                                         r"tensor_parallel_size \(3\)"):
        build_model(cfg, dtype=torch.float32, device="cpu", tp_rank=0, tp_size=3)
    with pytest.raises(ValueError, match=r"num_key_value_heads \(1\) must be divisible by "
                                         r"tensor_parallel_size \(2\)"):
        build_model(cfg, dtype=torch.float32, device="cpu", tp_rank=0, tp_size=2)
    cfg = dataclasses.replace(cfg, num_kv_heads=2)
    with pytest.raises(RuntimeError, match=r"needs torch\.distributed"):
        build_model(cfg, dtype=torch.float32, device="cpu", tp_rank=1, tp_size=2)
    assert cfg.kv_heads_per_rank(2) == 1


def test_kv_cache_must_fit_the_model(qwen_dir):
    from aioengine.worker.attention import build_attention_metadata
    from aioengine.worker.kv_cache import allocate_kv_cache

    model, cfg = load_model(qwen_dir[0], dtype="float32", device="cpu")
    meta = build_attention_metadata([(0, 3, [0])], 16)
    ids = torch.tensor([1, 2, 3])
    caches = allocate_kv_cache(cfg, 4, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="expected 2 KV cache tensors"):
        model(ids, meta.positions, meta, caches[:1])
    wrong = [torch.zeros(2, 3, 4, 16, 16) for _ in caches]
    with pytest.raises(ValueError, match=r"KV cache of shape \(2, 3, 4, 16, 16\) does not fit "
                                         r"this rank's 1 kv heads"):
        model(ids, meta.positions, meta, wrong)
    assert model(ids, meta.positions, meta, caches).shape == (3, 64)

"""``config.json`` -> ModelSpec without transformers, held against transformers' own reading
(``AutoConfig`` -> ``ModelSpec.from_hf``) of the very same files; a clear error per bad value;
and the engine's load path never imports transformers."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
from transformers import AutoConfig

from aioengine.hub import PRESETS, resolve_model
from aioengine.worker.loader import read_model_spec
from aioengine.worker.models.spec import SUPPORTED_ARCHITECTURES, ModelSpec
from tests.worker.hf_models import VARIANTS

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_SMALL = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 4}

# Hand-written configs: keys left out (family defaults), legacy and new spellings.
RAW_CONFIGS: dict[str, dict] = {
    **{f"bare-{t}": {"model_type": t, "architectures": [a]} for t, a in _ARCH.items()},
    # Qwen configs default to 32 kv heads (not "as many as attention heads"): state them.
    **{f"small-{t}": {"model_type": t, "architectures": [a], **_SMALL,
                      **({} if t == "llama" else {"num_key_value_heads": 2})}
       for t, a in _ARCH.items()},
    "bare-smollm3": {"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"]},
    # SmolLM3 with a window: transformers puts it on the NoPE layers only.
    "smollm3-window": {"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"],
                       **_SMALL, "num_hidden_layers": 4, "no_rope_layer_interval": 2,
                       "use_sliding_window": True, "sliding_window": 8},
    "qwen2-kv-default": {"model_type": "qwen2", "architectures": [_ARCH["qwen2"]], **_SMALL,
                         "num_attention_heads": 64, "hidden_size": 2048},
    "qwen3-null-kv-heads": {"model_type": "qwen3", "architectures": [_ARCH["qwen3"]], **_SMALL,
                            "num_key_value_heads": None},  # null: as many as attention heads
    "llama3-legacy-no-original": {
        "model_type": "llama", "architectures": [_ARCH["llama"]], **_SMALL,
        "max_position_embeddings": 4096, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
        "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0}},
    "llama3-top-level-original": {
        "model_type": "llama", "architectures": [_ARCH["llama"]], **_SMALL,
        "original_max_position_embeddings": 1024,
        "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 2048,
                            "rope_theta": 20000.0}},
    "linear-new-spelling": {
        "model_type": "llama", "architectures": [_ARCH["llama"]], **_SMALL, "dtype": "float16",
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1234.0}},
    "qwen2-flags-ignored": {  # Qwen2 has biased qkv, unbiased o/mlp, whatever the flags say
        "model_type": "qwen2", "architectures": [_ARCH["qwen2"]], **_SMALL,
        "attention_bias": False, "mlp_bias": True, "tie_word_embeddings": True,
        "num_key_value_heads": 4},
    "qwen3-attention-bias": {"model_type": "qwen3", "architectures": [_ARCH["qwen3"]], **_SMALL,
                             "attention_bias": True, "head_dim": 8, "num_key_value_heads": 1},
    "llama-biases": {"model_type": "llama", "architectures": [_ARCH["llama"]], **_SMALL,
                     "attention_bias": True, "mlp_bias": True, "num_key_value_heads": 2},
    "bare-qwen3_moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]},
    "bare-mixtral": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]},
    # As the released Qwen3-MoE configs spell it: num_experts, every other layer sparse.
    "qwen3-moe-released": {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], **_SMALL,
        "num_hidden_layers": 6, "num_experts": 16, "num_experts_per_tok": 4,
        "moe_intermediate_size": 24, "norm_topk_prob": True, "decoder_sparse_step": 2,
        "mlp_only_layers": [3], "num_key_value_heads": 2},
    # Phi-3-mini-128k (top-level original context) and Phi-4-mini (longrope,
    # partial rotary, a sliding window as long as the context: a no-op).
    "phi3-128k": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], **_SMALL,
                "max_position_embeddings": 4096, "original_max_position_embeddings": 256,
                "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8,
                                 "long_factor": [1.5 + i for i in range(8)]}},
    "phi4-mini": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], **_SMALL,
                  "num_key_value_heads": 2, "partial_rotary_factor": 0.75,
                  "max_position_embeddings": 2048, "original_max_position_embeddings": 128,
                  "sliding_window": 2048, "tie_word_embeddings": True, "rope_scaling": {
                      "type": "longrope", "short_factor": [1.1] * 6, "long_factor": [3.0] * 6}},
    "bare-mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
    "mistral-no-window": {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
                          **_SMALL, "num_key_value_heads": 2, "sliding_window": None},
    "mixtral-window": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                       **_SMALL, "num_key_value_heads": 2, "sliding_window": 32},
    "qwen2-window-layers": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                            **_SMALL, "num_key_value_heads": 2, "use_sliding_window": True,
                            "sliding_window": 64, "num_hidden_layers": 3,
                            "layer_types": ["sliding_attention", "full_attention",
                                            "sliding_attention"]},
    "qwen3-window-max-layers": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                                **_SMALL, "num_key_value_heads": 2, "use_sliding_window": True,
                                "sliding_window": 64, "max_window_layers": 1},
    "qwen2-window-off": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                         **_SMALL, "num_key_value_heads": 2, "sliding_window": 64},
    "bare-gemma3": {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]},
    # As Gemma 3 1B's config.json spells it (transformers 4.5x): local base and pattern.
    "gemma3-1b-style": {
        "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **_SMALL,
        "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 7, "sliding_window": 16,
        "sliding_window_pattern": 6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
        "query_pre_attn_scalar": 32, "final_logit_softcapping": None,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "bare-phi3": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]},
    "mixtral-small": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], **_SMALL,
                      "num_local_experts": 4, "num_experts_per_tok": 1, "num_key_value_heads": 2},
}


def _write(path: str, raw: dict) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(raw, f)
    return path


def _oracle(path: str) -> ModelSpec:
    return ModelSpec.from_hf(AutoConfig.from_pretrained(path))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_saved_parity_config_reads_as_transformers_does(variant, tmp_path):
    cls, kwargs = VARIANTS[variant]
    cls(**kwargs).save_pretrained(str(tmp_path))  # transformers 5 spelling (rope_parameters)
    spec = read_model_spec(str(tmp_path))
    assert spec == _oracle(str(tmp_path))
    assert spec.family == SUPPORTED_ARCHITECTURES[kwargs["architectures"][0]]


@pytest.mark.parametrize("name", sorted(RAW_CONFIGS))
def test_hand_written_config_reads_as_transformers_does(name, tmp_path):
    path = _write(str(tmp_path), RAW_CONFIGS[name])
    assert read_model_spec(path) == _oracle(path)


@pytest.mark.parametrize("name", ["tiny", *sorted(PRESETS)])
def test_builtin_configs_read_as_transformers_does(name):
    path = resolve_model(name).model_path
    assert read_model_spec(path) == _oracle(path)


def test_defaults_are_the_families_own():
    bare = {t: ModelSpec.from_config_dict(RAW_CONFIGS[f"bare-{t}"]) for t in _ARCH}
    assert (bare["llama"].num_kv_heads, bare["llama"].head_dim,
            bare["llama"].max_position_embeddings) == (32, 128, 2048)
    assert (bare["qwen2"].vocab_size, bare["qwen2"].max_position_embeddings) == (151936, 32768)
    small = {t: ModelSpec.from_config_dict(RAW_CONFIGS[f"small-{t}"]) for t in _ARCH}
    assert small["llama"].head_dim == 16 and small["qwen2"].head_dim == 16
    assert small["qwen3"].head_dim == 128  # Qwen3Config's default, not hidden // heads
    assert small["llama"].num_kv_heads == 4  # as many as attention heads
    assert ModelSpec.from_config_dict(RAW_CONFIGS["qwen2-kv-default"]).num_kv_heads == 32
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) must be a multiple of "
                                         r"num_key_value_heads \(32\)"):
        ModelSpec.from_config_dict({k: v for k, v in RAW_CONFIGS["small-qwen2"].items()
                                    if k != "num_key_value_heads"})
    spec = ModelSpec.from_config_dict(RAW_CONFIGS["llama3-legacy-no-original"])
    assert spec.rope.original_max_position == 4096 and spec.checkpoint_dtype == "bfloat16"
    spec = ModelSpec.from_config_dict(RAW_CONFIGS["llama3-top-level-original"])
    assert spec.rope.original_max_position == 1024 and spec.rope.theta == 20000.0


def test_phi3_rope():
    spec = ModelSpec.from_config_dict(RAW_CONFIGS["phi4-mini"])
    rope = spec.rope
    assert (rope.rope_type, rope.original_max_position, rope.partial_rotary_factor,
            rope.rotary_dim(spec.head_dim), rope.factor) == ("longrope", 128, 0.75, 12, 16.0)
    assert rope.attention_factor == pytest.approx((1 + math.log(16) / math.log(128)) ** 0.5)
    assert rope.long_factor == (3.0,) * 6
    raw = RAW_CONFIGS["phi3-128k"]
    long = ModelSpec.from_config_dict(raw).rope
    assert long.rope_type == "longrope" and long.original_max_position == 256
    # The older "su" spelling (transformers 5.24 itself no longer reads it: no oracle).
    su = ModelSpec.from_config_dict({**raw, "rope_scaling": {**raw["rope_scaling"],
                                                              "type": "su"}}).rope
    assert su == long


_PHI3 = {"architectures": ["Phi3ForCausalLM"], **_SMALL, "max_position_embeddings": 512,
         "original_max_position_embeddings": 64}


@pytest.mark.parametrize(("changes", "message"), [
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 7, "long_factor": [1.0] * 8}},
     r"longrope RoPE needs 'short_factor' as 8 positive numbers"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}},
     r"longrope RoPE needs 'long_factor' as 8 positive numbers .* got None"),
    ({"sliding_window": 0}, r"'sliding_window' must be a positive integer or null, got 0"),
    ({"partial_rotary_factor": 1.5}, r"partial rotary embeddings \(partial_rotary_factor=1\.5\)"),
    ({"architectures": ["LlamaForCausalLM"], "rope_scaling": {
        "type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}},
     r"rope type 'longrope' is supported for Phi-3 only"),
])
def test_bad_phi3_values_are_named(changes, message):
    with pytest.raises(ValueError, match=r"^cfg\.json: " + message):
        ModelSpec.from_config_dict({**_PHI3, **changes}, source="cfg.json")


def test_sliding_windows():
    def read(name):
        spec = ModelSpec.from_config_dict(RAW_CONFIGS[name])
        return spec.sliding_window, spec.window_layers, spec.all_layers_windowed

    assert read("bare-mistral") == (4096, tuple(range(32)), True)
    assert read("mistral-no-window") == (None, (), False)
    assert read("mixtral-window") == (32, (0, 1), True)
    assert read("qwen2-window-layers") == (64, (0, 2), False)
    assert read("qwen3-window-max-layers") == (64, (1,), False)
    assert read("qwen2-window-off") == (None, (), False)


def test_gemma3():
    spec = ModelSpec.from_config_dict(RAW_CONFIGS["gemma3-1b-style"])
    assert spec.window_layers == (0, 1, 2, 3, 4, 6) and not spec.all_layers_windowed
    assert spec.rope.rope_type == "linear" and spec.rope.theta == 1e6
    assert spec.local_rope is not None and spec.local_rope.theta == 1e4
    assert spec.local_rope.rope_type == "default"
    assert spec.attn_scale == 32 ** -0.5 and spec.embed_scale == 8.0
    assert spec.norm_offset and spec.sandwich_norms and spec.qk_norm
    bare = ModelSpec.from_config_dict(RAW_CONFIGS["bare-gemma3"])
    assert (bare.head_dim, bare.sliding_window, len(bare.window_layers)) == (256, 4096, 22)


_GEMMA = {"architectures": ["Gemma3ForCausalLM"], **_SMALL, "num_key_value_heads": 2}


@pytest.mark.parametrize(("changes", "message"), [
    ({"hidden_activation": "gelu"}, r"hidden_activation 'gelu' is not supported for Gemma 3"),
    ({"attn_logit_softcapping": 50.0},
     r"attention logit soft-capping \(attn_logit_softcapping=50\.0\) is not supported"),
    ({"use_bidirectional_attention": True}, r"bidirectional attention"),
    ({"final_logit_softcapping": -1}, r"'final_logit_softcapping' must be a positive number"),
    ({"query_pre_attn_scalar": 0}, r"'query_pre_attn_scalar' must be a positive number"),
    ({"sliding_window": None}, r"'sliding_window' must be a positive integer, got None"),
    ({"layer_types": ["sliding_attention"]}, r"'layer_types' must list 2 of"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1.0}}},
     r"'rope_parameters' by layer type must give exactly"),
    ({"architectures": ["Gemma3ForConditionalGeneration"]},
     r"unsupported model architecture \['Gemma3ForConditionalGeneration'\]"),
])
def test_bad_gemma3_values_are_named(changes, message):
    with pytest.raises(ValueError, match=r"^cfg\.json: " + message):
        ModelSpec.from_config_dict({**_GEMMA, **changes}, source="cfg.json")


def test_moe_layers_and_experts():
    spec = ModelSpec.from_config_dict(RAW_CONFIGS["qwen3-moe-released"])
    assert spec.moe_layers == (1, 5)  # (i + 1) % 2 == 0, minus mlp_only_layers [3]
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size,
            spec.norm_topk_prob, spec.qk_norm) == (16, 4, 24, True, True)
    bare = ModelSpec.from_config_dict(RAW_CONFIGS["bare-qwen3_moe"])
    assert (bare.num_experts, bare.num_experts_per_tok, len(bare.moe_layers)) == (128, 8, 24)
    mixtral = ModelSpec.from_config_dict(RAW_CONFIGS["mixtral-small"])
    assert mixtral.moe_layers == (0, 1) and mixtral.norm_topk_prob
    assert mixtral.moe_intermediate_size == 96 and not mixtral.qk_norm
    spec.check_tp(2)
    with pytest.raises(ValueError, match="moe_intermediate_size"):
        dataclasses.replace(spec, moe_intermediate_size=25).check_tp(2)


_MOE = {"architectures": ["Qwen3MoeForCausalLM"], **_SMALL, "num_key_value_heads": 2}


@pytest.mark.parametrize(("changes", "message"), [
    ({"num_experts": 0}, r"'num_experts' must be a positive integer, got 0"),
    ({"num_experts": 4, "num_experts_per_tok": 5},
     r"num_experts_per_tok \(5\) exceeds num_experts \(4\)"),
    ({"moe_intermediate_size": None}, r"'moe_intermediate_size' must be a positive integer"),
    ({"decoder_sparse_step": 0}, r"'decoder_sparse_step' must be a positive integer"),
    ({"mlp_only_layers": "0"}, r"'mlp_only_layers' must be a list of layer indices"),
    ({"norm_topk_prob": 1}, r"'norm_topk_prob' must be true or false"),
    ({"use_sliding_window": True, "sliding_window": "8"},
     r"'sliding_window' must be a positive integer or null, got '8'"),
])
def test_bad_moe_values_are_named(changes, message):
    with pytest.raises(ValueError, match=r"^cfg\.json: " + message):
        ModelSpec.from_config_dict({**_MOE, **changes}, source="cfg.json")


_SMOL = {"architectures": ["SmolLM3ForCausalLM"], **_SMALL}


def test_smollm3_nope_layers() -> None:
    layers = _SMALL["num_hidden_layers"]
    spec = ModelSpec.from_config_dict({**_SMOL, "no_rope_layer_interval": 2})
    assert spec.nope_layers == tuple(range(1, layers, 2)) and spec.window_layers == ()
    flags = [1] * layers
    flags[0] = 0
    spec = ModelSpec.from_config_dict({**_SMOL, "no_rope_layers": flags,
                                       "use_sliding_window": True, "sliding_window": 8})
    assert spec.nope_layers == (0,) and spec.window_layers == (0,)  # NoPE layers slide


@pytest.mark.parametrize(("changes", "message"), [
    ({"no_rope_layer_interval": 0}, r"'no_rope_layer_interval' must be a positive integer"),
    ({"no_rope_layers": [1]}, r"'no_rope_layers' must list \d+ flags \(1: rotary, 0: none\)"),
    ({"no_rope_layers": "1"}, r"'no_rope_layers' must list"),
])
def test_bad_smollm3_values_are_named(changes, message):
    with pytest.raises(ValueError, match=r"^cfg\.json: " + message):
        ModelSpec.from_config_dict({**_SMOL, **changes}, source="cfg.json")


def _raw(**changes) -> dict:
    return {"architectures": ["LlamaForCausalLM"], **_SMALL, **changes}


@pytest.mark.parametrize(("changes", "message"), [
    ({"hidden_size": "64"}, r"'hidden_size' must be a positive integer, got '64'"),
    ({"num_hidden_layers": 0}, r"'num_hidden_layers' must be a positive integer, got 0"),
    ({"vocab_size": True}, r"'vocab_size' must be a positive integer, got True"),
    ({"head_dim": 1.5}, r"'head_dim' must be a positive integer or null, got 1\.5"),
    ({"rms_norm_eps": -1}, r"'rms_norm_eps' must be a positive number, got -1"),
    ({"tie_word_embeddings": "yes"}, r"'tie_word_embeddings' must be true or false"),
    ({"architectures": "LlamaForCausalLM"}, r"'architectures' must be a list of strings"),
    ({"architectures": ["FalconForCausalLM"]},
     r"unsupported model architecture \['FalconForCausalLM'\]; supported: "),
    ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be a multiple of "
                                 r"num_key_value_heads \(3\)"),
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported"),
    ({"model_type": ["llama"], "architectures": []}, r"unsupported model architecture"),
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
      "num_key_value_heads": 2, "max_window_layers": -1},
     r"'max_window_layers' must be a non-negative integer"),
    ({"rope_parameters": [1, 2]}, r"'rope_parameters' must be an object"),
    ({"rope_theta": "big"}, r"'rope_theta' must be a positive number, got 'big'"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     r"rope type 'dynamic' is not supported; supported: \['default', 'linear', 'llama3', "
     r"'longrope'\]"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}},
     r"llama3 RoPE needs a positive 'low_freq_factor', got missing"),
    ({"rope_parameters": {"rope_type": "linear"}}, r"linear RoPE needs a positive 'factor'"),
    ({"partial_rotary_factor": 0.5}, r"partial rotary embeddings .* are not supported"),
])
def test_bad_values_are_named(changes, message):
    with pytest.raises(ValueError, match=r"^cfg\.json: " + message):
        ModelSpec.from_config_dict(_raw(**changes), source="cfg.json")


def test_bad_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model directory .* does not exist"):
        read_model_spec(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=r"no config\.json in model directory"):
        read_model_spec(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"malformed JSON in .*config\.json"):
        read_model_spec(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config\.json: expected a JSON object, got list"):
        read_model_spec(str(tmp_path))


def test_engine_load_path_does_not_import_transformers():
    """A fresh process builds a ModelRunner for tiny (the engine's own path: resolve, read the
    config, build, load safetensors, size and allocate the KV cache) without transformers."""
    code = textwrap.dedent("""
        import sys
        from aioengine.config import EngineConfig
        from aioengine.engine.core_proc import make_engine_target
        from aioengine.worker.model_runner import ModelRunner
        from aioengine.worker.worker_proc import make_worker_target
        runner = ModelRunner(EngineConfig(model="tiny", device="cpu", max_num_seqs=2))
        runner.allocate_kv_cache(runner.plan_kv_blocks())
        assert runner.spec.family == "llama" and runner.num_kv_blocks >= 0
        print(sorted(m for m in sys.modules if m.split(".")[0] == "transformers"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(os.path.dirname(
                             os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout

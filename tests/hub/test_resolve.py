"""resolve_model and read_model_info: built-ins, local directories, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from aioengine.hub import BUILTIN_MODELS, ResolvedModel, read_model_info, resolve_model


def test_builtins():
    assert set(BUILTIN_MODELS) >= {"tiny", "qwen2.5-0.5b", "llama-3.2-1b"}
    tiny = resolve_model("tiny")
    assert tiny.load_format_hint == "safetensors" and tiny.builtin
    for name in ("qwen2.5-0.5b", "llama-3.2-1b"):
        preset = resolve_model(name)
        assert preset.load_format_hint == "dummy" and preset.tokenizer_path == tiny.model_path
        info = read_model_info(preset.model_path)
        assert info.vocab_size > 100_000 and info.eos_token_ids == [1, 4]


def _model_dir(path, config=None) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config or {"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
                             "max_position_embeddings": 64, "eos_token_id": 2}, f)
    return str(path)


def test_local_directory(tmp_path):
    path = _model_dir(tmp_path / "m")
    resolved = resolve_model(path)
    assert resolved == ResolvedModel(path, path, path, "safetensors", False)
    info = read_model_info(path)
    assert (info.vocab_size, info.max_position_embeddings, info.eos_token_ids,
            info.chat_template) == (10, 64, [2], None)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    (tok / "chat_template.jinja").write_text("{{ messages }}")
    resolved = resolve_model(path, str(tok), require_tokenizer=True)
    assert resolved.tokenizer_path == str(tok)
    assert read_model_info(path, str(tok)).chat_template == "{{ messages }}"


def test_errors_name_the_path(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="neither a built-in model"):
        resolve_model(missing)
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ValueError, match=f"model path '{afile}' is not a directory"):
        resolve_model(str(afile))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"no config.json in model directory '{empty}'"):
        resolve_model(str(empty))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"malformed config.json in '{bad}'"):
        resolve_model(str(bad))
    good = _model_dir(tmp_path / "good")
    with pytest.raises(FileNotFoundError, match=f"no tokenizer.json in '{good}'"):
        resolve_model(good, require_tokenizer=True)
    with pytest.raises(FileNotFoundError, match=r"tokenizer directory .*nope.* does not exist"):
        resolve_model(good, missing)


def test_model_info_errors(tmp_path):
    path = _model_dir(tmp_path / "m", {"vocab_size": 10})
    with pytest.raises(ValueError, match="has no integer 'max_position_embeddings'"):
        read_model_info(path)
    path = _model_dir(tmp_path / "g")
    (tmp_path / "g" / "generation_config.json").write_text("[1, 2")
    with pytest.raises(ValueError, match=r"malformed JSON in .*generation_config\.json"):
        read_model_info(path)


def test_resolving_a_written_builtin_stays_light():
    """The host resolves models on every start: no torch, and numpy only to write one."""
    resolve_model("tiny")  # written once (shared test cache)
    code = ("import sys; from aioengine.hub import read_model_info, resolve_model; "
            "r = resolve_model('tiny', require_tokenizer=True); read_model_info(r.model_path); "
            "print(sorted({'numpy', 'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_served_model_name_is_short():
    from aioengine.hub import served_model_name

    assert served_model_name("tiny") == "tiny"
    assert served_model_name("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert served_model_name("/models/SmolLM2-135M-Instruct.Q4_1.gguf") == \
        "SmolLM2-135M-Instruct.Q4_1"
    assert served_model_name("/models/Qwen2.5-0.5B-Instruct/") == "Qwen2.5-0.5B-Instruct"
    assert served_model_name("~/m.GGUF") == "m"

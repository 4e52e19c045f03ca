"""Flags generated from dataclass fields: every flag of the programs explains itself, and the
help, types and choices are those of the fields."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
from dataclasses import dataclass, field
from typing import Literal

import pytest

from aioengine import EngineConfig
from aioengine.bench.options import BenchOptions
from aioengine.config import DTYPES, QUANTIZATIONS
from aioengine.field_args import add_field_args, field_docs, field_help, values_from_args


def serve_parser() -> argparse.ArgumentParser:
    from aioengine.server.__main__ import build_parser

    return build_parser()


def bench_parser() -> argparse.ArgumentParser:
    from aioengine.bench.__main__ import build_parser

    return build_parser()


@pytest.mark.parametrize("make", [serve_parser, bench_parser], ids=["serve", "bench"])
def test_every_flag_has_help(make):
    parser = make()
    missing = [a.option_strings or a.dest for a in parser._actions
               if not (a.help and a.help.strip())]
    assert not missing, f"flags without help: {missing}"
    # and the help renders (a stray '%' in a docstring would raise here)
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "--max-num-seqs" in out.getvalue() or "--quick" in out.getvalue()


def test_every_engine_field_but_extra_is_a_flag_with_its_docstring():
    actions = {a.dest: a for a in serve_parser()._actions}
    docs = field_docs(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        if f.name in ("extra", "cpu_kernels"):  # cpu_kernels: a flag per field, tested below
            assert f.name not in actions
            continue
        assert f.name in docs, f"EngineConfig.{f.name} has no docstring"
        action = actions[f.name]
        assert action.option_strings[0] == "--" + f.name.replace("_", "-")
        assert action.default == f.default
        first_words = " ".join(docs[f.name].split()[:3]).replace("``", "")
        assert action.help.startswith(first_words), (f.name, action.help)


def test_sample_engine_flags_read_their_annotations():
    parser = serve_parser()
    actions = {a.dest: a for a in parser._actions}
    assert tuple(actions["dtype"].choices) == DTYPES
    assert tuple(actions["quantization"].choices) == QUANTIZATIONS
    assert actions["dtype"].help.endswith("(default: auto)")
    assert "float32 on CPU" in actions["dtype"].help and "``" not in actions["dtype"].help
    assert actions["max_model_len"].type is int
    assert actions["kv_cache_memory_fraction"].type is float
    assert actions["enable_prefix_caching"].option_strings == [
        "--enable-prefix-caching", "--no-enable-prefix-caching"]
    assert actions["enable_prefix_caching"].help.endswith("(default: on)")
    args = parser.parse_args(["--no-enable-prefix-caching", "--max-model-len", "64",
                              "--dtype", "float32", "--kv-cache-memory-fraction", "0.25"])
    config = EngineConfig.from_cli_args(args)
    assert (config.enable_prefix_caching, config.max_model_len, config.dtype,
            config.kv_cache_memory_fraction) == (False, 64, "float32", 0.25)
    assert EngineConfig.from_cli_args(parser.parse_args([])) == EngineConfig()


def test_kv_cache_size_flags_take_human_units():
    parser = serve_parser()
    help_text = parser.format_help()
    for flag in ("--kv-cache-memory SIZE", "--kv-cache-tokens N", "--kv-cache-lock",
                 "--kv-cache-memory-fraction X"):
        assert flag in help_text, flag
    args = parser.parse_args(["--kv-cache-memory", "4GiB"])
    assert EngineConfig.from_cli_args(args).kv_cache_memory == 4 * 2**30
    args = parser.parse_args(["--kv-cache-tokens", "65536", "--kv-cache-lock"])
    config = EngineConfig.from_cli_args(args)
    assert (config.kv_cache_tokens, config.kv_cache_lock) == (65536, True)
    with pytest.raises(ValueError, match="kv_cache_memory must be a positive size"):
        EngineConfig.from_cli_args(parser.parse_args(["--kv-cache-memory", "4XB"]))


@pytest.mark.parametrize("argv, message", [
    (["--dtype", "float64"], "invalid choice: 'float64'"),
    (["--max-model-len", "lots"], "invalid int value: 'lots'"),
    (["--quantization", "q3"], "invalid choice: 'q3'"),
])
def test_bad_engine_flags_are_refused_by_name(argv, message):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        serve_parser().parse_args(argv)
    assert exc.value.code == 2
    assert argv[0] in err.getvalue() and message in err.getvalue()


def test_server_settings_flags_build_the_settings():
    from aioengine.server.__main__ import _SETTINGS_FLAGS
    from aioengine.server.app import ServerSettings

    parser = serve_parser()
    actions = {a.dest: a for a in parser._actions}
    assert actions["shutdown_grace_period"].option_strings == ["--grace-period"]
    assert actions["allow_credentials"].option_strings == [
        "--allow-credentials", "--no-allow-credentials"]
    assert actions["max_request_bytes"].help.startswith("Bodies over this get a 413.")
    args = parser.parse_args(["--grace-period", "2.5", "--allowed-origins", "https://a.example",
                              "https://b.example", "--allow-credentials",
                              "--served-model-name", "m"])
    settings = ServerSettings(**values_from_args(ServerSettings, args, _SETTINGS_FLAGS))
    assert settings.shutdown_grace_period == 2.5
    assert settings.allowed_origins == ("https://a.example", "https://b.example")
    assert settings.allow_credentials and settings.model_name == "m"
    defaults = ServerSettings(**values_from_args(ServerSettings, parser.parse_args([]),
                                                 _SETTINGS_FLAGS))
    assert defaults == ServerSettings()


def test_bench_flags_build_the_options():
    from aioengine.bench.__main__ import options_from_args, parse_args

    options = options_from_args(parse_args(["--no-progress", "--threads", "3", "--quantization",
                                            "gguf", "--only", "shm,uds"]))
    assert (options.progress, options.threads, options.quantization, options.only) == (
        False, 3, "gguf", ("shm", "uds"))
    assert options_from_args(parse_args([])) == BenchOptions()


@dataclass
class _Sample:
    name: str = "x"
    """The name, 100% ``literal``."""
    mode: Literal["a", "b"] = "a"
    """A mode."""
    tags: tuple[str, ...] = ()
    """Tags."""
    table: dict[str, int] = field(default_factory=dict)
    """Not a flag."""
    undocumented: int = 0


def test_help_is_cleaned_and_tuples_are_tuples():
    assert field_help(_Sample, "name") == "The name, 100%% literal."
    parser = argparse.ArgumentParser()
    add_field_args(parser, _Sample, only=("name", "mode", "tags"))
    args = parser.parse_args(["--tags", "p", "q", "--mode", "b"])
    assert values_from_args(_Sample, args) == {"name": "x", "mode": "b", "tags": ("p", "q")}


def test_fields_without_a_command_line_form_or_a_docstring_are_errors():
    with pytest.raises(TypeError, match=r"_Sample.table: no command-line form"):
        add_field_args(argparse.ArgumentParser(), _Sample, only=("table",))
    with pytest.raises(KeyError, match=r"_Sample.undocumented has no docstring"):
        add_field_args(argparse.ArgumentParser(), _Sample, only=("undocumented",))
    with pytest.raises(ValueError, match=r"_Sample has no field\(s\) \['nope'\]"):
        add_field_args(argparse.ArgumentParser(), _Sample, exclude=("nope",))
    with pytest.raises(TypeError, match="is not a dataclass"):
        add_field_args(argparse.ArgumentParser(), int)

"""``CpuKernelConfig`` (``EngineConfig.cpu_kernels``): every switch validated by name, carried to
the child processes in the config's msgpack, and a flag of ``python -m aioengine.serve``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import msgspec
import pytest

from aioengine import EngineConfig
from aioengine.config import QUANT_ISAS, CpuKernelConfig
from aioengine.field_args import field_docs, flag_name
from aioengine.server.__main__ import build_parser

FIELDS = [f.name for f in dataclasses.fields(CpuKernelConfig)]
BOOLS = [n for n in FIELDS if n != "quant_isa"]


def test_defaults_are_every_switch_on() -> None:
    c = CpuKernelConfig()
    assert all(getattr(c, n) is True for n in BOOLS)
    assert c.quant_isa == "best" and QUANT_ISAS[0] == "best"
    assert EngineConfig().cpu_kernels == c
    assert set(FIELDS) == {"cpu_ops", "decode_plan", "decode_plan_split", "decode_lane",
                           "cpu_gemv", "huge_pages", "quant_isa", "quant_x8",
                           "quant_x8_prefill"}


@pytest.mark.parametrize("name", FIELDS)
def test_a_bad_value_is_refused_naming_the_field(name: str) -> None:
    bad = "sse9" if name == "quant_isa" else "no"
    with pytest.raises(ValueError, match=rf"cpu_kernels\.{name} must be .*got '{bad}'"):
        CpuKernelConfig(**{name: bad})  # type: ignore[arg-type]


def test_a_non_bool_int_is_refused() -> None:
    with pytest.raises(ValueError, match=r"cpu_kernels\.decode_plan must be True or False, "
                                         r"got 0"):
        CpuKernelConfig(decode_plan=0)  # type: ignore[arg-type]


def test_engine_config_takes_only_a_cpu_kernel_config() -> None:
    with pytest.raises(ValueError, match="cpu_kernels must be a CpuKernelConfig, got dict"):
        EngineConfig(cpu_kernels={"cpu_ops": False})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", FIELDS)
def test_each_field_round_trips_through_msgpack(name: str) -> None:
    value = "avx2" if name == "quant_isa" else False
    config = EngineConfig(cpu_kernels=CpuKernelConfig(**{name: value}))  # type: ignore[arg-type]
    back = EngineConfig.from_msgpack(config.to_msgpack())
    assert back == config and getattr(back.cpu_kernels, name) == value
    assert isinstance(back.cpu_kernels, CpuKernelConfig)


def test_a_bad_value_on_the_wire_is_a_decode_error() -> None:
    wire = msgspec.msgpack.encode({"cpu_kernels": {"quant_isa": "sse9"}})
    with pytest.raises(msgspec.ValidationError, match=r"cpu_kernels\.quant_isa"):
        EngineConfig.from_msgpack(wire)


def test_every_field_is_a_flag_and_parses_back() -> None:
    parser = build_parser()
    actions = {a.dest: a for a in parser._actions}
    docs = field_docs(CpuKernelConfig)
    for name in FIELDS:
        action = actions[name]
        assert action.option_strings[0] == flag_name(name)
        first_words = " ".join(docs[name].split()[:3]).replace("``", "")
        assert action.help.startswith(first_words), (name, action.help)
    assert tuple(actions["quant_isa"].choices) == QUANT_ISAS
    args = parser.parse_args(["--no-decode-plan", "--quant-isa", "avx2", "--no-huge-pages"])
    config = EngineConfig.from_cli_args(args)
    assert config.cpu_kernels == CpuKernelConfig(decode_plan=False, quant_isa="avx2",
                                                 huge_pages=False)
    assert EngineConfig.from_cli_args(parser.parse_args([])) == EngineConfig()


def test_serve_help_shows_every_switch() -> None:
    out = subprocess.run([sys.executable, "-m", "aioengine.serve", "--help"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "cpu kernels:" in out
    for name in FIELDS:
        assert flag_name(name) in out, name
        if name != "quant_isa":
            assert "--no-" + flag_name(name)[2:] in out, name

"""The structured bench in its smallest form (speed is not asserted), and its 150k vocabulary."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import jsonschema
from tokenizers import Tokenizer

from aioengine.bench import structured
from aioengine.messages import StructuredOutputs
from aioengine.structured import GrammarBackend

ROOT = Path(__file__).resolve().parents[2]


def test_the_big_tokenizer_has_150k_tokens_and_the_walk_gives_valid_json(tmp_path) -> None:
    path, _, eos = structured._tokenizer_of("tiny")
    big = structured.big_tokenizer(path, str(tmp_path))
    tok = Tokenizer.from_file(big)
    assert tok.get_vocab_size(with_added_tokens=True) == structured.BIG_VOCAB
    backend = GrammarBackend(big, structured.BIG_VOCAB, eos)
    schema = structured.schema_20()
    matcher = backend.matcher(backend.compile(StructuredOutputs(json=schema)))
    import random

    import numpy as np

    rng = random.Random(1)
    out = np.zeros((1, backend.words), dtype=np.int32)
    tokens = []
    while not matcher.is_terminated:
        backend.fill_bitmask([matcher], out)
        t = structured._walk(rng, out[0])
        assert matcher.accept(t)
        tokens.append(t)
    text = tok.decode([t for t in tokens if t not in eos])
    jsonschema.validate(json.loads(text), schema)
    assert len(tokens) > structured.NEW_TOKENS  # longer than the decode rows measure


def test_structured_suite_smallest_form(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "aioengine.bench", "structured", "--quick", "--no-progress",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = {(r["name"], r["metric"]): r for r in json.loads(out.read_text())["results"]}
    for key, unit in [(("unconstrained", "decode_tok_s_b1"), "tok/s"),
                      (("json_schema", "decode_tok_s_b16"), "tok/s"),
                      (("json_schema", "vs_unconstrained_b1"), "x"),
                      (("json_schema", "vs_unconstrained_b16"), "x"),
                      (("compile_20_fields", "cold_ms_p50"), "ms"),
                      (("compile_20_fields", "cached_ms_p50"), "ms"),
                      (("mask_150k", "mask_us_per_step_b32"), "us")]:
        assert got[key]["unit"] == unit and math.isfinite(got[key]["value"]) \
            and got[key]["value"] > 0, key
    assert got[("compile_20_fields", "cached_ms_p50")]["value"] < \
        got[("compile_20_fields", "cold_ms_p50")]["value"]

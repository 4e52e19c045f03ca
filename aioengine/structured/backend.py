"""The grammar library behind structured outputs: llguidance (the only module importing it).

Why llguidance: a Rust core with no Python dependencies (xgrammar's wheel pulls torch,
transformers and triton), and lazy: a grammar's lexer and parser states are built as decoding
reaches them, so even a large schema "compiles" in well under a millisecond and the per-token
mask costs tens of microseconds (see docs/structured-outputs.md for the figures on this box).

A ``GrammarBackend`` is built once per engine from the model's ``tokenizer.json``;
``compile`` turns a ``StructuredOutputs`` into a ``CompiledGrammar`` (thread-safe, it drops
the GIL) and ``matcher`` gives each request its own ``GrammarMatcher``, a copy of the compiled
one. ``fill_bitmask`` writes the allowed-token bitmask of several matchers at once.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from aioengine.messages.sampling_params import StructuredOutputs
from aioengine.structured.schema import closed_objects

if TYPE_CHECKING:
    import llguidance
    import numpy as np

# llguidance is imported where a grammar is first checked or built, not with this module: the
# engine and the server import this module at start-up (the import takes a noticeable time,
# and its library's pages), for constrained requests that may never come.

# Compact JSON with Python's separators and no other whitespace: a model cannot wander off into
# whitespace (a weak one otherwise may pad for hundreds of tokens), and this is the layout
# json.dumps writes, the one models saw most.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


_WHAT = {"json": "JSON schema", "json_object": "JSON schema", "regex": "regex",
         "choice": "choice", "grammar": "grammar"}


# Below this many usable cores the rows are filled one after the other: llguidance's executor
# defaults to 80% of the cores, one thread on a 2-core box, and handing the rows to that one
# thread was far slower than the plain loop; two threads were no faster than the loop either
# (docs/benchmarks.md).
PARALLEL_MIN_CORES = 4
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class GrammarError(ValueError):
    """A schema, regex or grammar that does not compile; the message says where and why."""


def spec_key(spec: StructuredOutputs) -> str:
    """A cache key: equal for constraints that compile to the same grammar."""
    kind = spec.kind
    if kind == "json":
        schema = spec.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                return f"json-text:{schema}"
        return "json:" + json.dumps(schema, sort_keys=True, separators=(",", ":"))
    if kind == "choice":
        return "choice:" + json.dumps(spec.choice)
    if kind == "json_object":
        return "json_object"
    return f"{kind}:{getattr(spec, kind)}"


def grammar_text(spec: StructuredOutputs) -> str:
    """The llguidance grammar (its JSON form) for ``spec``; raises ``GrammarError`` for what
    can be told without compiling (a schema that is not JSON, a GBNF that does not convert).
    A JSON schema's objects are closed to their declared properties unless they say otherwise
    (``aioengine.structured.schema``)."""
    import llguidance
    import llguidance.gbnf_to_lark

    kind = spec.kind
    if kind in ("json", "json_object"):
        schema = spec.json if kind == "json" else {"type": "object"}
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"structured_outputs.json is not valid JSON: {e}") from e
        if not isinstance(schema, (dict, bool)):
            raise GrammarError("structured_outputs.json must be a JSON schema object, got "
                               f"{type(schema).__name__}")
        if kind == "json":  # json_object's ``{"type": "object"}`` lists nothing: any object
            schema = closed_objects(schema)
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema,
                                                                 overrides=_JSON_OPTIONS)
        except ValueError as e:
            raise GrammarError(f"invalid JSON schema: {e}") from e
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if kind == "choice":
        lark = "start: " + " | ".join(json.dumps(c) for c in spec.choice)
        return llguidance.LLMatcher.grammar_from_lark(lark)
    try:  # GBNF (rules with ``::=``) is converted; Lark passes through
        text = llguidance.gbnf_to_lark.any_to_lark(spec.grammar)
    except Exception as e:  # the converter raises its own and bare exceptions
        raise GrammarError(f"invalid GBNF grammar: {e}") from e
    return llguidance.LLMatcher.grammar_from_lark(text)


def check_spec(spec: StructuredOutputs) -> None:
    """Raise ``GrammarError`` if ``spec`` does not compile (no tokenizer needed: a server checks
    a request before it reaches the engine)."""
    import llguidance

    message = llguidance.LLMatcher.validate_grammar(grammar_text(spec))
    if message:
        raise GrammarError(f"invalid {_WHAT[spec.kind]}: {message}")


_CHECKED: OrderedDict[str, str] = OrderedDict()
_CHECKED_SIZE = 256
_checked_lock = threading.Lock()


def spec_error(spec: StructuredOutputs) -> str | None:
    """``check_spec``'s message for ``spec`` (None: it compiles), remembered by key for the
    last 256 constraints: clients send the same schema again and again, and a check compiles
    the schema."""
    key = spec_key(spec)
    with _checked_lock:
        error = _CHECKED.get(key)
        if error is not None:
            _CHECKED.move_to_end(key)
            return error or None
    try:
        check_spec(spec)
        error = ""
    except GrammarError as e:
        error = str(e)
    with _checked_lock:
        _CHECKED[key] = error
        while len(_CHECKED) > _CHECKED_SIZE:
            _CHECKED.popitem(last=False)
    return error or None


class CompiledGrammar:
    """A compiled grammar: a matcher at the start state, copied for every request."""

    __slots__ = ("_template", "key")

    def __init__(self, key: str, template: llguidance.LLMatcher) -> None:
        self.key = key
        self._template = template


class GrammarMatcher:
    """One request's position in its grammar."""

    __slots__ = ("_m",)

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._m = matcher

    def accept(self, token_id: int) -> bool:
        """Advance by the sampled token; False if the grammar does not allow it."""
        return self._m.consume_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        if not self._m.rollback(num_tokens):
            raise GrammarError(f"cannot roll back {num_tokens} tokens: {self._m.get_error()}")

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its end (eos) was accepted: nothing more may follow."""
        return self._m.is_stopped()

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None


class GrammarBackend:
    def __init__(self, tokenizer_json: str, vocab_size: int,
                 eos_token_ids: Sequence[int]) -> None:
        """``tokenizer_json``: the model's ``tokenizer.json`` (a file, or the directory holding
        it); ``vocab_size``: the model's logit width (masks cover it; ids past the tokenizer's
        vocabulary are never allowed); ``eos_token_ids``: the tokens that end a finished
        grammar."""
        import llguidance

        path = tokenizer_json
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise GrammarError(f"structured outputs need the model's tokenizer.json, and there "
                               f"is none at {path}")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.tokenizer = llguidance.LLTokenizer(text, n_vocab=vocab_size,
                                                eos_token=list(eos_token_ids) or None)
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._executor: llguidance.LLExecutor | None = None

    def compile(self, spec: StructuredOutputs) -> CompiledGrammar:
        """Compile ``spec`` for this tokenizer; raises ``GrammarError``. Thread-safe; the
        heavy part runs without the GIL."""
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer, grammar_text(spec), log_level=0)
        if matcher.is_error():
            raise GrammarError(f"invalid {_WHAT[spec.kind]}: {matcher.get_error()}")
        return CompiledGrammar(spec_key(spec), matcher)

    def matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        return GrammarMatcher(compiled._template.deep_copy())

    def fill_bitmask(self, matchers: Sequence[GrammarMatcher], out: np.ndarray) -> None:
        """Write each matcher's allowed tokens into row ``i`` of ``out`` (int32,
        ``[>= len(matchers), words]``, C-contiguous). Several rows are computed in parallel
        (llguidance's thread pool) on a machine with ``PARALLEL_MIN_CORES`` cores or more."""
        if out.dtype.itemsize != 4 or out.ndim != 2 or out.shape[1] != self.words \
                or not out.flags["C_CONTIGUOUS"] or out.shape[0] < len(matchers):
            raise ValueError(f"bitmask must be a contiguous int32 [>= {len(matchers)}, "
                             f"{self.words}] array, got {out.dtype} {out.shape}")
        row_bytes = self.words * 4
        if len(matchers) == 1 or _CORES < PARALLEL_MIN_CORES:
            for i, m in enumerate(matchers):
                m._m.unsafe_compute_mask_ptr(out.ctypes.data + i * row_bytes, row_bytes)
            return
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        self._executor.unsafe_compute_mask_ptr(
            [(m._m, i) for i, m in enumerate(matchers)], out.ctypes.data, row_bytes,
            out.shape[0])

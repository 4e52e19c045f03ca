"""SamplingParams: per-request generation controls (public API; crosses process boundaries)."""

from __future__ import annotations

from typing import Any

import msgspec

INT64_MAX = 2**63 - 1  # msgpack ints past int64 do not survive the trip to the engine


class StructuredOutputs(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A constraint on the output (vLLM's field names): set exactly one of the fields. The
    engine compiles it into a grammar off its step loop and lets the model pick only tokens
    the grammar allows; an invalid schema, regex or grammar ends the request with
    ``finish_reason="error"`` naming the cause."""

    json: dict[str, Any] | str | None = None
    """A JSON schema (a dict, or its JSON text): the output is one JSON value matching it."""
    json_object: bool = False
    """Any JSON object."""
    regex: str | None = None
    """A regular expression (Rust ``regex`` syntax) the whole output matches."""
    choice: list[str] | None = None
    """The output is exactly one of these strings."""
    grammar: str | None = None
    """A context-free grammar: Lark (llguidance's dialect) or GBNF (llama.cpp's)."""

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar")
                 if getattr(self, name) is not None]
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object must be a bool, got "
                             f"{self.json_object!r}")
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            raise ValueError("structured_outputs must set exactly one of json, json_object, "
                             f"regex, choice, grammar; got {given or 'none'}")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError("structured_outputs.json must be a JSON schema (a dict or its JSON "
                             f"text), got {type(self.json).__name__}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got "
                                 f"{value!r}")
        if self.choice is not None and (
                not isinstance(self.choice, list) or not self.choice
                or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of non-empty "
                             f"strings, got {self.choice!r}")

    @property
    def kind(self) -> str:
        """Which field is set: ``json``, ``json_object``, ``regex``, ``choice`` or ``grammar``."""
        if self.json_object:
            return "json_object"
        return next(n for n in ("json", "regex", "choice", "grammar")
                    if getattr(self, n) is not None)


# The sampler divides float32 logits by temperature and repetition_penalty: below this they
# overflow to inf (5e-324 is 0 in float32), the probabilities turn NaN and the draw falls off
# the vocabulary, which killed the engine for every request (found by fuzzing the server).
MIN_DIVISOR = 1e-6


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to pick tokens for one request. Every field is validated on construction with a
    ``ValueError`` that names the field, so a bad request never reaches the engine."""

    max_tokens: int = 16
    """Most tokens to generate (at least 1); the request ends with ``length`` there."""
    temperature: float = 1.0
    """0 is greedy (argmax); higher flattens the distribution. 0 or in [1e-6, 100]."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches this."""
    top_k: int = -1  # -1: no top-k cut
    """Keep the ``k`` most likely tokens; -1 keeps all."""
    min_p: float = 0.0
    """Drop tokens less likely than ``min_p`` times the most likely one."""
    repetition_penalty: float = 1.0
    """Above 1 discourages tokens already in the prompt or output (1 is off). In [1e-6, 100]."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token already generated, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtracted once per earlier occurrence of a token in the output, in [-2, 2]."""
    seed: int | None = None
    """Makes sampling reproducible whatever else shares the batch (and after preemption)."""
    stop: list[str] = msgspec.field(default_factory=list)
    """Strings that end the request; the text stops before them (see below). A single string
    is accepted."""
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    """Token ids that end the request (besides the model's eos ids); reported as
    ``stop_reason``."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the text."""
    ignore_eos: bool = False
    """Keep generating past the model's eos tokens (until ``max_tokens`` or a stop)."""
    min_tokens: int = 0
    """Tokens to generate before eos, stop token ids or stop strings may end the request."""
    logprobs: int | None = None  # None: none; 0: the sampled token's; n: plus the top n
    """None: no log-probabilities; 0: the sampled token's; ``n`` (up to 20): also the top
    ``n`` alternatives at each position. Computed from the raw model logits."""
    skip_special_tokens: bool = True
    """Leave special tokens (eos, chat markers) out of the decoded text."""
    structured_outputs: StructuredOutputs | None = None
    """Constrain the output to a JSON schema, a regex, a choice or a grammar (see
    ``StructuredOutputs``). While it is unfinished the grammar, not ``min_tokens``, decides
    whether eos may come."""
    logit_bias: dict[int, float] | None = None
    """Added to the logits of these token ids before sampling (OpenAI's ``logit_bias``: values
    in [-100, 100]; -100 bans a token, 100 all but forces it)."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check_int("max_tokens", self.max_tokens, low=1, high=INT64_MAX)
        _check_float("temperature", self.temperature, low=0.0, high=100.0)
        if 0.0 < self.temperature < MIN_DIVISOR:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_DIVISOR}, got "
                             f"{self.temperature}")
        _check_float("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        _check_int("top_k", self.top_k, low=-1, high=INT64_MAX)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (disabled) or at least 1, got 0")
        _check_float("min_p", self.min_p, low=0.0, high=1.0)
        _check_float("repetition_penalty", self.repetition_penalty, low=MIN_DIVISOR,
                     high=100.0)
        _check_float("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        _check_float("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        if self.seed is not None:
            _check_int("seed", self.seed, low=0, high=INT64_MAX)
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s
                                                      for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX
                for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be integers in [0, 2**63), got "
                             f"{self.stop_token_ids!r}")
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        _check_int("min_tokens", self.min_tokens, low=0, high=self.max_tokens)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, low=0, high=20)
        if self.structured_outputs is not None and \
                not isinstance(self.structured_outputs, StructuredOutputs):
            raise ValueError("structured_outputs must be a StructuredOutputs, got "
                             f"{type(self.structured_outputs).__name__}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict of token id to bias, got "
                                 f"{self.logit_bias!r}")
            for token, bias in self.logit_bias.items():
                _check_int("logit_bias token id", token, low=0, high=INT64_MAX)
                _check_float(f"logit_bias[{token}]", bias, low=-100.0, high=100.0)

    @property
    def greedy(self) -> bool:
        """True for temperature 0."""
        return self.temperature == 0.0


def _check_int(name: str, value: object, *, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")


def _check_float(name: str, value: object, *, low: float, high: float,
                 low_open: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value < low or value > high or (low_open and value == low):
        left = "(" if low_open else "["
        raise ValueError(f"{name} must be in {left}{low}, {high}], got {value}")

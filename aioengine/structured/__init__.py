"""Structured outputs: grammars (JSON schema, regex, choice, CFG) compiled into token masks.

``schema`` closes a JSON schema's objects to their declared properties; ``backend`` is the
only module that knows the grammar library (llguidance); the engine keeps one matcher per
constrained request (``aioengine.engine.grammars``) and the worker's sampler applies the
bitmask the engine sends with each step.
"""

from aioengine.structured.backend import (
    CompiledGrammar,
    GrammarBackend,
    GrammarError,
    GrammarMatcher,
    check_spec,
    spec_error,
    spec_key,
)
from aioengine.structured.schema import closed_objects

__all__ = ["CompiledGrammar", "GrammarBackend", "GrammarError", "GrammarMatcher",
           "check_spec", "closed_objects", "spec_error", "spec_key"]

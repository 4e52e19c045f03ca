"""Command-line flags from a dataclass's fields: one source of truth for names, types and help.

Each field becomes ``--field-name``; its type comes from the real annotation
(``typing.get_type_hints``), its help from the field's docstring (the string literal written
right under it), its default from the field:

- ``bool``: ``--x`` / ``--no-x``;
- ``Literal["a", "b"]``: ``choices``;
- ``int``, ``float``, ``str`` (each also ``| None``): that type;
- ``int | str`` (also ``| None``): a string (a size with a unit, parsed by the dataclass);
- ``tuple[str, ...]``: one or more values (``nargs="+"``), given back as a tuple.

Any other annotation is a ``TypeError`` naming the field: a new field must choose how it reads
from the command line, not get a flag that silently parses text.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args, get_origin, get_type_hints


@functools.cache
def field_docs(cls: type) -> Mapping[str, str]:
    """``{field: docstring}`` for the fields of ``cls`` that have one, read from its source
    (the string expression right after the annotated assignment), cleaned like docstrings."""
    body = _class_body(cls)
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return types.MappingProxyType(docs)


def _class_body(cls: type) -> list[ast.stmt]:
    """The statements of ``cls``'s class body. A class reachable by its qualified name is found
    in its module's whole source, parsed by ``ast`` (C): ``inspect.getsource`` would find the
    class's lines with Python's own tokenizer, slow enough to show in every server start.
    A class defined in a function is left to ``inspect``."""
    module = inspect.getmodule(cls)
    if module is not None and "<locals>" not in cls.__qualname__:
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            source = None
        nodes: list[ast.stmt] | None = ast.parse(source).body if source is not None else None
        for part in cls.__qualname__.split("."):
            if nodes is None:
                break
            nodes = next((n.body for n in nodes
                          if isinstance(n, ast.ClassDef) and n.name == part), None)
        if nodes is not None:
            return nodes
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return next(n for n in tree.body if isinstance(n, ast.ClassDef)).body


def field_help(cls: type, name: str) -> str:
    """The docstring of field ``name`` as one line of ``--help`` text (reST literals
    unquoted, ``%`` escaped for argparse); ``KeyError`` naming it when it has none."""
    try:
        doc = field_docs(cls)[name]
    except KeyError:
        raise KeyError(f"{cls.__name__}.{name} has no docstring to use as its --help") from None
    text = re.sub(r"``([^`]+)``", r"\1", " ".join(doc.split()))
    return text.replace("%", "%%")


def flag_name(name: str) -> str:
    """``max_model_len`` -> ``--max-model-len``."""
    return "--" + name.replace("_", "-")


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    if get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(args) < len(get_args(hint)):
            return args[0], True
    return hint, False


def _shown_default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value) or "none"
    return str(value).replace("%", "%%")


def add_field_args(group: argparse._ActionsContainer, cls: type, *,
                   only: Iterable[str] | None = None, exclude: Iterable[str] = (),
                   flags: Mapping[str, str] | None = None,
                   metavars: Mapping[str, str] | None = None) -> list[argparse.Action]:
    """Add one flag per field of dataclass ``cls`` to ``group`` (a parser or an argument
    group), in field order: every field, or those named in ``only``, less ``exclude``.
    ``flags`` renames a field's flag (``{"model_name": "--served-model-name"}``); the parsed
    value is stored under the field's name either way. Returns the actions added."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    wanted = list(by_name) if only is None else list(only)
    unknown = [n for n in [*wanted, *exclude, *(flags or {})] if n not in by_name]
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    skipped = set(exclude)
    actions = []
    for name in wanted:
        if name in skipped:
            continue
        f = by_name[name]
        default = (f.default if f.default is not dataclasses.MISSING
                   else f.default_factory() if f.default_factory is not dataclasses.MISSING
                   else None)
        flag = (flags or {}).get(name, flag_name(name))
        kwargs = _argument_kwargs(cls.__name__, name, hints[name])
        if metavars and name in metavars:
            kwargs["metavar"] = metavars[name]
        text = f"{field_help(cls, name)} (default: {_shown_default(default)})"
        action = group.add_argument(flag, dest=name, default=default, **kwargs)
        # Set after: BooleanOptionalAction appends its own "(default: ...)" on some Pythons.
        action.help = text
        actions.append(action)
    return actions


def _argument_kwargs(owner: str, name: str, hint: Any) -> dict[str, Any]:
    inner, _ = _unwrap_optional(hint)
    if inner is bool:
        return {"action": argparse.BooleanOptionalAction}
    if get_origin(inner) is Literal:
        choices = get_args(inner)
        kinds = {type(c) for c in choices}
        if len(kinds) != 1:
            raise TypeError(f"{owner}.{name}: Literal choices of mixed types {choices}")
        return {"type": kinds.pop(), "choices": choices}
    if inner in (int, float):
        return {"type": inner, "metavar": "N" if inner is int else "X"}
    if inner is str:
        return {"type": inner}
    if get_origin(inner) in (typing.Union, types.UnionType) \
            and {a for a in get_args(inner) if a is not type(None)} == {int, str}:
        # a number or a number with a unit (``--kv-cache-memory 4GiB``): the config parses it
        return {"type": str, "metavar": "SIZE"}
    if get_origin(inner) is tuple and get_args(inner)[1:] == (Ellipsis,) \
            and get_args(inner)[0] in (int, float, str):
        return {"type": get_args(inner)[0], "nargs": "+", "action": _TupleStore}
    raise TypeError(f"{owner}.{name}: no command-line form for the type {hint!r}; exclude the "
                    "field or give it one of bool, Literal[...], int, float, str, "
                    "tuple[X, ...]")


class _TupleStore(argparse.Action):
    """``nargs="+"`` values stored as a tuple (the dataclass field's type), not a list."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, tuple(values))


def values_from_args(cls: type, args: argparse.Namespace,
                     only: Iterable[str] | None = None) -> dict[str, Any]:
    """``{field: value}`` for the fields of ``cls`` present in ``args`` (parsed with flags
    from ``add_field_args``), restricted to ``only`` when given."""
    names = [f.name for f in dataclasses.fields(cls)] if only is None else list(only)
    return {n: getattr(args, n) for n in names if hasattr(args, n)}

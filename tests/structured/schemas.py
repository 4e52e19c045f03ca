"""A small generator of random JSON schemas that a weak model can always finish: strings have
a maxLength, arrays a maxItems, integers a range, so every constrained output terminates."""

from __future__ import annotations

from hypothesis import strategies as st

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)

leaf = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda lo, w: {"type": "integer", "minimum": lo, "maximum": lo + w},
              st.integers(-50, 50), st.integers(0, 500)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda vals: {"enum": vals},
              st.lists(st.text(alphabet="xyz ABC", min_size=1, max_size=5), min_size=1,
                       max_size=4, unique=True)),
)


def objects(children: st.SearchStrategy) -> st.SearchStrategy:
    def build(props: dict, required_mask: list[bool]) -> dict:
        names = list(props)
        return {"type": "object", "properties": props,
                "required": [n for n, r in zip(names, required_mask, strict=False) if r],
                "additionalProperties": False}

    return st.dictionaries(NAMES, children, min_size=1, max_size=4).flatmap(
        lambda props: st.builds(build, st.just(props),
                                st.lists(st.booleans(), min_size=len(props),
                                         max_size=len(props))))


def arrays(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n},
                     children, st.integers(0, 3))


schemas = objects(st.recursive(leaf, lambda c: st.one_of(objects(c), arrays(c)), max_leaves=6))

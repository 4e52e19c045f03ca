"""Sizes in human units: ``"4GiB"`` -> bytes, and bytes -> ``"4.00 GiB"`` (no torch; bottom layer).

Binary units (``KiB``, ``MiB``, ``GiB``, ``TiB``) are powers of 1024; decimal ones (``KB``,
``MB``, ``GB``, ``TB``) powers of 1000, as the SI and ``ls --si`` read them; ``B`` or no unit
is bytes. A space between number and unit is allowed; case is not significant except that a
lone ``k``/``m``/``g``/``t`` (``4g``, as ``docker --memory`` writes it) is binary.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*")


def parse_size(value: int | str, field: str) -> int:
    """Bytes from an int or a string such as ``"4GiB"``, ``"512 MB"``, ``"1073741824"``; a
    ``ValueError`` naming ``field`` for anything else (a negative or zero size included)."""
    if isinstance(value, bool):
        raise ValueError(f"{field} must be a size in bytes or with a unit, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE.fullmatch(value.lower())
        if m is None or m.group(2) not in _UNITS:
            raise ValueError(f"{field} must be a positive size such as 4GiB, 512MiB or 8GB "
                             f"(units: {', '.join(u for u in _UNITS if len(u) > 1)}), got "
                             f"{value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2)])
    else:
        raise ValueError(f"{field} must be a size in bytes or with a unit, got {value!r}")
    if n < 1:
        raise ValueError(f"{field} must be a positive size, got {value!r}")
    return n


def format_bytes(n: int | float) -> str:
    """``1536 * 2**20`` -> ``"1.50 GiB"`` (binary units, two decimals)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"

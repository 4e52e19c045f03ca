"""shm addresses: ``shm://NAME`` names a rendezvous socket in Linux's abstract Unix-socket
namespace (``\\0aioengine-shm-NAME``), so nothing of ours ever appears on disk or in /dev/shm."""

from __future__ import annotations

import os
import re
import secrets

from transports.errors import AddressError

PREFIX = "aioengine-shm-"
# sun_path holds 108 bytes; an abstract name spends one on its leading NUL.
MAX_NAME = 107 - len(PREFIX)
_NAME = re.compile(r"[A-Za-z0-9._-]+")


def parse_name(address: str | None) -> str:
    """The channel name in ``address`` (``NAME`` or ``shm://NAME``); None picks a fresh random
    one that no other endpoint can guess."""
    if address is None:
        return f"{os.getpid()}-{secrets.token_hex(8)}"
    if not isinstance(address, str):
        raise AddressError(f"shm address must be a str, got {type(address).__name__}")
    name = address[len("shm://"):] if address.startswith("shm://") else address
    if not name:
        raise AddressError(f"empty shm channel name in {address!r} (expected shm://NAME)")
    if len(name) > MAX_NAME:
        raise AddressError(f"shm channel name {name!r} is {len(name)} characters; at most "
                           f"{MAX_NAME} fit in an abstract socket address")
    if not _NAME.fullmatch(name):
        raise AddressError(f"shm channel name {name!r} may only hold letters, digits, '.', '_' "
                           "and '-' (it names an abstract socket, not a file path)")
    return name


def socket_address(name: str) -> str:
    """The abstract-namespace socket address (leading NUL: no file is ever created)."""
    return "\0" + PREFIX + name


def url(name: str) -> str:
    return f"shm://{name}"

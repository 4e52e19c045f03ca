"""Unix socket addresses: default endpoints get a fresh abstract name (no file at all); an
explicit filesystem path gets a 0600 socket file, removed on every exit path the process lives
through (``close()``, garbage collection, interpreter exit)."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import weakref

from transports.errors import AddressError

# sun_path is 108 bytes on Linux including the terminating NUL.
MAX_UNIX_PATH = 107


def check_unix_path(path: str, url: str) -> None:
    if not path:
        raise AddressError(f"empty socket path in {url!r}")
    if path.startswith("@"):
        name = path[1:]
        if not name:
            raise AddressError(f"empty abstract socket name in {url!r}")
        size = len(name.encode())
    else:
        size = len(os.fsencode(path))
    if size > MAX_UNIX_PATH:
        raise AddressError(
            f"socket path in {url!r} is {size} bytes; Unix sockets allow at most "
            f"{MAX_UNIX_PATH} (use a shorter path or an abstract name '@name')")
    if not path.startswith("@"):
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise AddressError(f"directory {parent!r} of socket path in {url!r} does not exist")


def check_not_other_file(path: str, url: str) -> None:
    """Binding replaces a stale socket file, never anything else that lives at the path."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise AddressError(f"{url!r} names an existing file that is not a socket; "
                           "refusing to replace it")


def abstract_name(prefix: str) -> str:
    """A fresh ``@name`` in Linux's abstract socket namespace: no file, so nothing can be left
    on disk whatever way the process ends (SIGKILL included); the kernel drops the name with
    the last socket. Unguessable, but visible in /proc/net/unix, so binders must check the
    peer's uid (SO_PEERCRED; zmq: ZMQ_IPC_FILTER_UID)."""
    return f"@{prefix}{os.getpid()}-{secrets.token_hex(8)}"


class FileCleanup:
    """Removes a socket file when ``run()`` is called or the owner is garbage collected,
    whichever comes first."""

    def __init__(self, owner: object, path: str | None) -> None:
        self._finalizer = weakref.finalize(owner, _remove, path)

    def run(self) -> None:
        self._finalizer()


def _remove(path: str | None) -> None:
    if path is not None and not path.startswith("@"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

"""Private filesystem addresses: a fresh 0700 directory per default endpoint, 0600 socket files,
and removal on every exit path (``close()``, garbage collection, interpreter exit)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
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


def private_dir(prefix: str) -> str:
    """A new directory only this user can enter (mkdtemp creates it 0700)."""
    return tempfile.mkdtemp(prefix=prefix)


class FileCleanup:
    """Removes a socket file (and the private directory it lives in, if we made one) when
    ``run()`` is called or the owner is garbage collected, whichever comes first."""

    def __init__(self, owner: object, path: str | None, directory: str | None) -> None:
        self._finalizer = weakref.finalize(owner, _remove, path, directory)

    def run(self) -> None:
        self._finalizer()


def _remove(path: str | None, directory: str | None) -> None:
    if path is not None and not path.startswith("@"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)

"""Write a built-in model directory once, safely under concurrency.

Each writer builds into its own temporary directory next to the target, then renames it into
place; ``rename`` of a directory is atomic, so a reader sees either nothing or a complete
directory. A loser of the race discards its copy. The version is part of the directory name,
so a changed builder never reads an old layout.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable

from aioengine.config import cache_dir

logger = logging.getLogger(__name__)


def models_root() -> str:
    return os.path.join(cache_dir(), "models")


def ensure_dir(name: str, build: Callable[[str], None]) -> str:
    """``<cache>/models/<name>``, calling ``build(tmpdir)`` to create it when absent."""
    root = models_root()
    target = os.path.join(root, name)
    if os.path.isdir(target):
        return target
    try:
        os.makedirs(root, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root)
    except OSError as e:  # an OSError still, but one that says which setting to change
        raise OSError(e.errno, f"cannot write the built-in model {name!r} under {root} "
                      f"({e.strerror}); set AIOENGINE_CACHE to a writable directory") from e
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is readable like any
        for folder, dirs, files in os.walk(tmp):
            for d in dirs:
                os.chmod(os.path.join(folder, d), 0o755)
            for f in files:
                os.chmod(os.path.join(folder, f), 0o644)
        try:
            os.rename(tmp, target)
            logger.info("wrote built-in model %s", target)
        except OSError:
            if not os.path.isdir(target):  # not a lost race: a real failure
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return target

"""Linux process controls through ctypes (no dependency): process name and parent-death signal."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
TASK_COMM_LEN = 16  # the kernel keeps 15 bytes of a process name plus NUL


def _prctl(option: int, arg: int | bytes) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        logger.debug("prctl(%d) failed: errno %d", option, ctypes.get_errno())
        return False
    return True


def set_process_title(title: str) -> None:
    """Name this process for ``ps``/``top``/psutil: ``setproctitle`` (whole command line) when
    installed, and always the kernel's short name (``comm``, first 15 bytes) on Linux."""
    try:
        import setproctitle  # optional
    except ImportError:
        pass
    else:
        setproctitle.setproctitle(title)
    _prctl(PR_SET_NAME, title.encode()[: TASK_COMM_LEN - 1])


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` when our parent *thread* exits. Because it fires on the
    thread's exit, not the process's, the receiver must confirm with ``os.getppid()``."""
    return _prctl(PR_SET_PDEATHSIG, signum)

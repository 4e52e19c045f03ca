"""The server program's defences against running out of file descriptors.

asyncio logs a full traceback for every failed ``accept()`` when the process is out of file
descriptors (and retries a second later): 400 slow clients against a 256-descriptor limit wrote
184k tracebacks (81 MB of log). The program raises its soft descriptor limit to the hard one
and lets through one such line per burst, with the count of the ones it held back.
"""

from __future__ import annotations

import logging
import resource
import time

ACCEPT_FAILURE = "socket.accept() out of system resource"


class AcceptFailureFilter(logging.Filter):
    """At most one accept-failure record per ``interval`` seconds; the next one says how many
    were dropped in between."""

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._last = float("-inf")
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(ACCEPT_FAILURE):
            return True
        now = time.monotonic()
        if now - self._last < self.interval:
            self._dropped += 1
            return False
        self._last = now
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.msg}: {record.exc_info[1]}"
        if self._dropped:
            record.msg = f"{record.msg}\n({self._dropped} more since the last such line)"
            self._dropped = 0
        record.exc_info = None  # the error is in the message now; no traceback per burst
        record.exc_text = None
        return True


def guard_descriptors(logger: logging.Logger) -> None:
    """Raise the soft RLIMIT_NOFILE to the hard limit and filter asyncio's accept failures."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            logger.debug("could not raise the open-file limit from %d to %d: %s", soft, hard, e)
    logging.getLogger("asyncio").addFilter(AcceptFailureFilter())

"""Memory ordering between the processes that share a ring, and how CPython provides it.

What the ring needs:

1. *Publish* (writer): the payload bytes must be visible to a reader before the cursor that
   covers them. *Consume* (reader): the reader must finish loading a record before it publishes
   the tail cursor that lets the writer overwrite it. Both are store->store / load->load /
   load->store orderings.
2. *Sleeping flags* (Dekker's pattern): a waiter stores ``sleeping = 1`` and then loads the
   peer's cursor; the peer stores its cursor and then loads ``sleeping``. Each side's
   store->load pair must be ordered, or both can miss each other and the waiter sleeps on a
   message that already arrived (a lost wake-up).

How the stores happen: every cursor and flag lives in its own 8-byte-aligned slot of the
page-aligned header and is read and written through ``memoryview.cast("Q")`` item access, which
CPython implements as one ``memcpy`` of 8 bytes -- a single aligned 8-byte load or store, so a
cursor is never seen half-written. The payload is copied by ``memcpy`` (slice assignment) in an
earlier, separate C call; neither the compiler nor the interpreter can move the cursor store
ahead of it because they are separate opaque calls on the eval loop.

How ordering holds on x86-64: TSO keeps stores in program order with other stores and loads
with other loads, and never moves a store ahead of an earlier load, which covers (1). The two
exceptions are handled explicitly: glibc's ``memcpy`` uses non-temporal stores / ``rep movsb``
for large copies, whose stores are weakly ordered, so a record of ``BIG_RECORD`` bytes or more
is followed by a full fence before its cursor is published (glibc already ends non-temporal
loops with ``sfence``; the fence makes it independent of the libc). And TSO *does* let a load
pass an earlier store (the store buffer), which breaks (2): both sides put a full fence between
the store and the load. The GIL does not help here -- the peer is another process with its own
GIL -- so we never rely on it for cross-process ordering.

Where a full fence comes from: CPython exposes no fence, but acquiring and releasing an
uncontended ``threading.Lock`` runs glibc's ``sem_trywait``/``sem_post``, whose atomic
compare-and-swap / fetch-add are ``lock``-prefixed instructions on x86 -- full barriers (about
60 ns here). On weakly-ordered CPUs (aarch64, ppc64le, riscv64) the same pair is a
store-release followed by a load-acquire, which ARMv8 orders (RCsc), so release+acquire acts as
a full fence there too; on such machines ``FENCE_EVERY_CURSOR`` is true and the ring fences
around *every* cursor publish and after every cursor load, instead of relying on TSO.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable

# Records at least this large are copied with weakly-ordered string/non-temporal stores.
BIG_RECORD = 2048

_TSO_MACHINES = frozenset({"x86_64", "amd64", "i386", "i486", "i586", "i686", "x86"})
FENCE_EVERY_CURSOR = platform.machine().lower() not in _TSO_MACHINES


def make_fence() -> Callable[[], None]:
    """A full memory barrier: acquire+release of a private, never-contended lock. Each endpoint
    makes its own, so no state is shared between endpoints."""
    lock = threading.Lock()
    acquire, release = lock.acquire, lock.release

    def fence() -> None:
        acquire()
        release()

    return fence

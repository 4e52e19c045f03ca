"""The ``shm`` transport: a lock-free single-writer ring buffer in shared memory.

- The writer creates the ring in a sealed ``memfd`` (no name in /dev/shm, nothing on disk) and
  hands it, with eventfds for wake-ups, to each reader over a Unix socket in the abstract
  namespace (``shm://NAME`` is ``\\0aioengine-shm-NAME``), checking the peer is the same user.
  That connection stays open as the liveness channel, so a SIGKILLed peer is noticed at once;
  the kernel frees the memory when the last process unmaps it, whatever way it exits.
- Messages up to half the ring are one record, read in place (zero copy, valid until the next
  ``recv``); larger ones stream through in chunks into a reused buffer, so any size works with
  a ring of a few MiB. A full ring blocks the writer (bounded backpressure, nothing dropped).
- Broadcast keeps one tail cursor per reader; the writer waits for the slowest.
- Waiting: a blocking reader spins briefly and adaptively, then sleeps on its eventfd; async
  endpoints wait in the event loop. Shared "sleeping" flags mean a sender only makes a
  wake-up syscall when the peer is actually asleep (``ordering`` explains why it is safe); a
  writer waiting for space asks to be woken once a quarter of the ring is free.
- ``recv`` returns views into the ring, valid until the next ``recv`` on that endpoint.
  An endpoint is for one thread at a time (``close()`` may come from any thread).
"""

# The eight openers every implementation exposes (see transports.factory), re-exported.
from transports.shm.aio import open_async_broadcast_reader as open_async_broadcast_reader
from transports.shm.aio import open_async_broadcast_writer as open_async_broadcast_writer
from transports.shm.aio import open_async_reader as open_async_reader
from transports.shm.aio import open_async_writer as open_async_writer
from transports.shm.sync import open_broadcast_reader as open_broadcast_reader
from transports.shm.sync import open_broadcast_writer as open_broadcast_writer
from transports.shm.sync import open_reader as open_reader
from transports.shm.sync import open_writer as open_writer

"""Child programs of the transport bench, each a fresh interpreter (never forked):

    python -m aioengine.bench.transport_peers ROLE KIND URL [RANK]

``KIND`` is the transport short name the child binds its reply channel with. A child prints
``ready ADDRESS`` (its reply writer's address) and serves until the parent closes.
Roles: ``echo`` returns every message; ``sink`` swallows data and answers each ``E`` message
with an ``A`` (so the parent can time a burst); ``bsink`` is a sink on a broadcast rank;
``idle`` waits in recv() and nothing else.
"""

from __future__ import annotations

import sys

import transports as T


def main(argv: list[str]) -> int:
    role, kind, url = argv[:3]
    rank = int(argv[3]) if len(argv) > 3 else -1
    if role == "idle":
        r = T.open_reader(url)
        print("ready -", flush=True)
        try:
            r.recv()
        except T.PeerClosedError:
            pass
        r.close()
        return 0
    r = T.open_reader(url) if rank < 0 else T.open_broadcast_reader(url, rank)
    w = T.open_writer(kind)
    print("ready", w.address, flush=True)
    try:
        while True:
            msg = r.recv()
            if role == "echo":
                w.send(msg.header, msg.buffers)
            elif bytes(msg.header[:1]) == b"E":
                w.send(b"A")
    except T.PeerClosedError:
        return 0
    finally:
        r.close()
        w.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Which replica gets a request: the one likely to hold its prompt's prefix, else the least loaded.

Load is what the client itself knows exactly, with no polling: per replica the requests sent and
not yet answered (waiting) and those producing tokens (running). As in vLLM's DP load balancer a
waiting request weighs 4 running ones (it still needs its prefill, and it queues behind them).

Prefix affinity: a prompt's full blocks are hashed as the engine's prefix cache hashes them
(chained: each block's hash covers every token before it), and the router remembers, for the
most recent hashes, which replica last got a prompt through that block. The replica holding the
longest such chain wins unless it is much busier than the least loaded one (``slack``): a
prefix hit saves one prefill, an overloaded replica costs every request queued on it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

_ROOT_HASH = 0x5EED  # the engine's chain start (engine/block_manager.py)
WAITING_WEIGHT = 4  # vLLM's weight for a waiting request against a running one
POLICIES = ("prefix", "least_loaded", "round_robin")


class ReplicaLoad:
    """One replica's load as the client counts it."""

    __slots__ = ("alive", "finished", "routed", "running", "waiting")

    def __init__(self) -> None:
        self.waiting = 0
        self.running = 0
        self.routed = 0  # requests sent to it since start
        self.finished = 0
        self.alive = True

    @property
    def score(self) -> int:
        return WAITING_WEIGHT * self.waiting + self.running


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The chained hashes of the prompt's full blocks."""
    hashes: list[int] = []
    prev = _ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = hash((prev, *token_ids[start:start + block_size]))
        hashes.append(prev)
    return hashes


class PrefixRouter:
    """Picks a replica per request; ``max_hashes`` bounds the affinity table (LRU).
    ``policy``: ``prefix`` (affinity, else least loaded), ``least_loaded``, or ``round_robin``
    (the next live replica whatever its load: the bench's reference point)."""

    def __init__(self, loads: Sequence[ReplicaLoad], block_size: int, *,
                 policy: str = "prefix", slack: int = 2 * WAITING_WEIGHT,
                 max_hashes: int = 65536) -> None:
        if not loads:
            raise ValueError("a router needs at least one replica")
        if policy not in POLICIES:
            raise ValueError(f"routing policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.loads = loads
        self.block_size = block_size
        self.slack = slack
        self.max_hashes = max_hashes
        self._owner: OrderedDict[int, int] = OrderedDict()  # block hash -> replica index
        self._next = 0  # rotates ties so an idle set fills evenly
        self.affinity_hits = 0
        """Requests sent to a replica because it held part of their prefix."""

    def pick(self, token_ids: Sequence[int]) -> int:
        """The replica for this prompt; ``LookupError`` when none is alive."""
        alive = [i for i, load in enumerate(self.loads) if load.alive]
        if not alive:
            raise LookupError("no replica is alive")
        n = len(self.loads)
        start = self._next
        if self.policy == "round_robin":
            chosen = min(alive, key=lambda i: (i - start) % n)
            self._next = (chosen + 1) % n
            return chosen
        least = min(alive, key=lambda i: (self.loads[i].score, (i - start) % n))
        self._next = (least + 1) % n
        if self.policy == "least_loaded":
            return least
        hashes = block_hashes(token_ids, self.block_size)
        chosen = least
        best = self._longest_owner(hashes)
        if best is not None and self.loads[best].alive \
                and self.loads[best].score <= self.loads[least].score + self.slack:
            chosen = best
            self.affinity_hits += best != least
        self._remember(hashes, chosen)
        return chosen

    def forget_replica(self, index: int) -> None:
        """A replica died: its cached prefixes are gone with it."""
        for h in [h for h, i in self._owner.items() if i == index]:
            del self._owner[h]

    def forget_all(self) -> None:
        """The replicas' prefix caches were reset."""
        self._owner.clear()

    def _longest_owner(self, hashes: list[int]) -> int | None:
        owner = None
        for h in hashes:  # a chain: a later block matches only if every earlier one did
            i = self._owner.get(h)
            if i is None:
                break
            owner = i
        return owner

    def _remember(self, hashes: list[int], index: int) -> None:
        table = self._owner
        for h in hashes:
            table[h] = index
            table.move_to_end(h)
        while len(table) > self.max_hashes:
            table.popitem(last=False)

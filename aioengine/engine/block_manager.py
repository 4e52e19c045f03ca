"""KV block manager: fixed-size blocks with reference counts and a prefix cache.

A full block is cached under a chained hash of (previous block's hash, its tokens). A hit is
never trusted on the hash alone: the stored block must hold the same tokens and hang off the
same parent content (``parent_cid``). Blocks whose count drops to zero keep their content and
wait in an LRU. A sequence frees its blocks last-first, so a prefix's tail is evicted before
its head.

Contiguity: a sequence's blocks are handed out as one run of adjacent ids when possible, so the
worker can attend to its KV as a strided view of the cache instead of gathering it every step
(``worker.attention``). An admission takes a run sized for its whole expected length (prompt +
``max_tokens``) and reserves the part it does not use yet; growing takes the next block of the
run. Where runs come from, best first: never-cached unreserved blocks; a run that also evicts
cached blocks, but only from the older half of the LRU (contiguity is worth more than the
youngest cached prefixes); else single blocks as before (never-cached, then reserved ones of
other sequences, then the LRU's oldest) and the worker gathers.
"""

from __future__ import annotations

import re
from collections import OrderedDict

from aioengine.engine.request import Request

_ROOT_HASH = 0x5EED  # chain start; a fixed int so hashes are the same in every process
_ROOT_CID = 0  # parent content id of a sequence's first block

# Block states (one byte each in ``BlockManager._state``, searched with ``re`` for runs).
_USED = 0
_FREE = 1  # never cached (or cleared), not reserved
_CACHED = 2  # evictable: ref count 0, content kept for a prefix hit
_RESERVED = 3  # free, kept for the growth of the sequence whose run ends just before it
_YOUNG = 4  # only in the scratch copy of a run search: a cached block too young to evict
_FREE_RUNS = re.compile(b"\\x01+")
_TAKEABLE_RUNS = re.compile(b"[\\x01\\x02]+")


def _best_fit(runs: re.Pattern[bytes], state: bytearray, want: int,
              need: int) -> tuple[int, int] | None:
    """The shortest stretch matching ``runs`` that holds ``want`` blocks, else ``need``: (its
    first id, the blocks to take or reserve there: ``want``, or the whole shorter stretch)."""
    best_want = best_need = None
    for m in runs.finditer(state):
        n = m.end() - m.start()
        if n >= want and (best_want is None or n < best_want[1]):
            best_want = (m.start(), n)
        elif n >= need and (best_need is None or n < best_need[1]):
            best_need = (m.start(), n)
    if best_want is not None:
        return best_want[0], want
    return best_need


class _Block:
    __slots__ = ("block_id", "cid", "hash", "parent_cid", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None  # set while the block may be found by a lookup
        self.cid = 0  # content id: equal for blocks holding the same prefix, 0 = none
        self.parent_cid = _ROOT_CID
        self.token_ids: tuple[int, ...] = ()

    def clear(self) -> None:
        self.hash = None
        self.cid = 0
        self.parent_cid = _ROOT_CID
        self.token_ids = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be "
                             "positive")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._state = bytearray([_FREE]) * num_blocks
        self._num_free = num_blocks  # _FREE and _RESERVED blocks: no reusable content
        self._reserved: dict[str, tuple[int, int]] = {}  # request id -> its reserved ids lo:hi
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unused; oldest first
        self._by_hash: dict[int, int] = {}
        self._next_cid = 1
        self.query_tokens = 0
        self.hit_tokens = 0

    # ---- statistics ----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self._num_free + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_evictable_blocks(self) -> int:
        """Blocks no request holds that keep a cached prefix (free, reused first by a hit)."""
        return len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._by_hash)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    # ---- prefix lookup -------------------------------------------------------------------
    def _update_hashes(self, req: Request, num_blocks: int) -> None:
        bs, tokens, hashes = self.block_size, req.token_ids, req.block_hashes
        for i in range(len(hashes), num_blocks):
            prev = hashes[i - 1] if i else _ROOT_HASH
            hashes.append(hash((prev, *tokens[i * bs:(i + 1) * bs])))

    def find_cached_prefix(self, req: Request) -> list[int]:
        """Blocks holding a verified prefix of ``req.token_ids``. At most ``(n-1)//block_size``
        blocks, so the last token is always recomputed and there is something to sample from.
        Takes no reference; pass the result to ``allocate``."""
        if not self.enable_prefix_caching:
            return []
        bs, tokens = self.block_size, req.token_ids
        limit = (len(tokens) - 1) // bs
        self._update_hashes(req, limit)
        found: list[int] = []
        parent = _ROOT_CID
        for i in range(limit):
            bid = self._by_hash.get(req.block_hashes[i])
            if bid is None:
                break
            block = self._blocks[bid]
            if block.parent_cid != parent or block.token_ids != tuple(tokens[i * bs:(i + 1) * bs]):
                break  # a hash collision: the stored content differs
            found.append(bid)
            parent = block.cid
        return found

    # ---- allocation ----------------------------------------------------------------------
    def allocate(self, req: Request, num_new_tokens: int, cached: list[int] = ()) -> bool:
        """Give ``req`` blocks for ``num_new_tokens`` more tokens past those computed (after the
        ``cached`` prefix on a first admission). All or nothing: returns False, changing nothing,
        when too few blocks are free."""
        if cached and req.block_ids:
            raise ValueError(f"request {req.request_id!r} already holds blocks; cached prefix "
                             "blocks are only taken on admission")
        bs = self.block_size
        num_cached_tokens = len(cached) * bs
        total = req.num_computed_tokens + num_cached_tokens + num_new_tokens
        needed = max(0, -(-total // bs) - len(req.block_ids) - len(cached))
        revived = sum(1 for bid in cached if self._blocks[bid].ref_count == 0)
        if needed + revived > self.num_free_blocks:
            return False
        admission = not req.block_ids
        for bid in cached:
            block = self._blocks[bid]
            if block.ref_count == 0:
                del self._evictable[bid]
                self._state[bid] = _USED
            block.ref_count += 1
        req.block_ids.extend(cached)
        if needed:
            self._take(req, needed, admission)
        if admission:
            req.num_computed_tokens += num_cached_tokens
            req.num_registered_blocks = len(cached)
            if req.num_preemptions == 0:
                req.num_cached_tokens = num_cached_tokens
                self.query_tokens += req.num_tokens
                self.hit_tokens += num_cached_tokens
        return True

    def _take(self, req: Request, needed: int, admission: bool) -> None:
        """Append ``needed`` fresh blocks to ``req.block_ids``, continuing or starting a run."""
        state, ids = self._state, req.block_ids
        nxt = ids[-1] + 1 if ids else self.num_blocks
        while needed and nxt < self.num_blocks and state[nxt] in (_FREE, _RESERVED):
            ids.append(self._claim(nxt))  # the run goes on (into its reservation)
            nxt += 1
            needed -= 1
        if needed and admission:
            total = req.num_prompt_tokens + req.params.max_tokens
            want = min(max(needed, -(-total // self.block_size) - len(ids)), self.num_blocks)
            run = self._find_run(want, needed)
            if run is not None:
                start, length = run
                ids.extend(self._claim(b) for b in range(start, start + needed))
                self._reserve(req, start + needed, start + length)
                return
        ids.extend(self._claim(self._any_block()) for _ in range(needed))

    def _find_run(self, want: int, need: int) -> tuple[int, int] | None:
        """(first id, length) of a run of ``want`` (else ``need``) blocks that may be taken:
        never-cached unreserved ones, else also cached ones from the older half of the LRU.
        Best fit: the shortest free stretch that holds it, so long stretches stay whole."""
        run = _best_fit(_FREE_RUNS, self._state, want, need)
        if run is not None:
            return run
        old = len(self._evictable) - len(self._evictable) // 2
        if need > self._num_free + old:
            return None
        scratch = bytearray(self._state)
        for i, bid in enumerate(reversed(self._evictable)):
            if i >= len(self._evictable) - old:
                break
            scratch[bid] = _YOUNG
        return _best_fit(_TAKEABLE_RUNS, scratch, want, need)

    def _any_block(self) -> int:
        """One block outside any run: never-cached, then the LRU's oldest, then another
        sequence's reserved one (taking it breaks that sequence's run later)."""
        at = self._state.find(_FREE)
        if at >= 0:
            return at
        if self._evictable:
            return next(iter(self._evictable))
        return self._state.find(_RESERVED)

    def _claim(self, bid: int) -> int:
        """Mark ``bid`` used by one sequence (evicting its cached content if it had any)."""
        state = self._state[bid]
        if state == _CACHED:
            del self._evictable[bid]
            block = self._blocks[bid]
            if self._by_hash.get(block.hash) == bid:  # type: ignore[arg-type]
                del self._by_hash[block.hash]  # type: ignore[arg-type]
            block.clear()
        elif state in (_FREE, _RESERVED):
            self._num_free -= 1
        else:
            raise RuntimeError(f"block {bid} is in use; cannot hand it out again")
        self._state[bid] = _USED
        self._blocks[bid].ref_count = 1
        return bid

    def _reserve(self, req: Request, lo: int, hi: int) -> None:
        """Keep ``lo:hi`` (free or old cached blocks, right after ``req``'s run) for its growth;
        cached ones are evicted now, as the run was chosen to take them."""
        for bid in range(lo, hi):
            self._claim(bid)
            self._blocks[bid].ref_count = 0
            self._state[bid] = _RESERVED
            self._num_free += 1
        if hi > lo:
            self._reserved[req.request_id] = (lo, hi)

    def cache_computed_blocks(self, req: Request) -> None:
        """Offer ``req``'s full, computed blocks to the prefix cache (after a step ran)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = min(req.num_computed_tokens, req.num_tokens) // bs
        if num_full <= req.num_registered_blocks:
            return
        self._update_hashes(req, num_full)
        for i in range(req.num_registered_blocks, num_full):
            block = self._blocks[req.block_ids[i]]
            parent = self._blocks[req.block_ids[i - 1]].cid if i else _ROOT_CID
            tokens = tuple(req.token_ids[i * bs:(i + 1) * bs])
            h = req.block_hashes[i]
            block.hash, block.parent_cid, block.token_ids = h, parent, tokens
            other = self._by_hash.get(h)
            if other is not None and self._blocks[other].parent_cid == parent \
                    and self._blocks[other].token_ids == tokens:
                block.cid = self._blocks[other].cid  # same content computed twice: share its id
            else:
                block.cid = self._next_cid
                self._next_cid += 1
                self._by_hash[h] = block.block_id  # new content (or a collision: newest wins)
        req.num_registered_blocks = num_full

    # ---- release -------------------------------------------------------------------------
    def free(self, req: Request) -> None:
        """Drop ``req``'s references, last block first. Idempotent."""
        for bid in reversed(req.block_ids[req.num_window_freed:]):
            self._release(req, bid)
        req.block_ids = []
        req.num_registered_blocks = 0
        req.num_window_freed = 0
        lo, hi = self._reserved.pop(req.request_id, (0, 0))
        for bid in range(lo, hi):
            if self._state[bid] == _RESERVED:
                self._state[bid] = _FREE

    def release_before_window(self, req: Request, window: int) -> int:
        """Sliding-window attention: free ``req``'s leading blocks whose every position is
        before the first key its next query (at ``num_computed_tokens``) can see. Their
        ``block_ids`` entries become placeholders (block 0: the worker masks them out, the
        decode kernel never reads them). Returns how many blocks were freed now."""
        first_key = req.num_computed_tokens - window + 1
        dead = min(max(0, first_key) // self.block_size, len(req.block_ids) - 1)
        if self.enable_prefix_caching:  # the next block registered takes its parent's id
            dead = min(dead, req.num_registered_blocks - 1)
        freed = 0
        for i in range(req.num_window_freed, dead):
            self._release(req, req.block_ids[i])
            req.block_ids[i] = 0
            freed += 1
        req.num_window_freed = max(req.num_window_freed, dead)
        return freed

    def _release(self, req: Request, bid: int) -> None:
        block = self._blocks[bid]
        if block.ref_count <= 0:
            raise RuntimeError(f"block {bid} freed with reference count {block.ref_count} "
                               f"(request {req.request_id!r})")
        block.ref_count -= 1
        if block.ref_count:
            return
        if block.hash is not None and self._by_hash.setdefault(block.hash, bid) == bid:
            self._evictable[bid] = None  # keep its content for a later hit
            self._state[bid] = _CACHED
        else:
            block.clear()  # partial, uncacheable, or a duplicate of a cached block
            self._state[bid] = _FREE
            self._num_free += 1

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix; blocks in use keep serving their requests."""
        for bid in self._evictable:
            self._blocks[bid].clear()
            self._state[bid] = _FREE
        self._num_free += len(self._evictable)
        self._evictable.clear()
        self._by_hash.clear()
        for block in self._blocks:
            block.hash = None  # in use: never found again, and not kept once freed

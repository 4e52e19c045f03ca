"""KV block manager: fixed-size blocks with reference counts and a prefix cache.

A full block is cached under a chained hash of (previous block's hash, its tokens). A hit is
never trusted on the hash alone: the stored block must hold the same tokens and hang off the
same parent content (``parent_cid``). Blocks whose count drops to zero keep their content and
wait in an LRU; fresh blocks come from the never-cached pool first, then the LRU's oldest.
A sequence frees its blocks last-first, so a prefix's tail is evicted before its head.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from aioengine.engine.request import Request

_ROOT_HASH = 0x5EED  # chain start; a fixed int so hashes are the same in every process
_ROOT_CID = 0  # parent content id of a sequence's first block


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
        self._free: deque[int] = deque(range(num_blocks))  # hold no reusable content
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unused; oldest first
        self._by_hash: dict[int, int] = {}
        self._next_cid = 1
        self.query_tokens = 0
        self.hit_tokens = 0

    # ---- statistics ----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

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
            block.ref_count += 1
        req.block_ids.extend(cached)
        req.block_ids.extend(self._take_free() for _ in range(needed))
        if admission:
            req.num_computed_tokens += num_cached_tokens
            req.num_registered_blocks = len(cached)
            if req.num_preemptions == 0:
                req.num_cached_tokens = num_cached_tokens
                self.query_tokens += req.num_tokens
                self.hit_tokens += num_cached_tokens
        return True

    def _take_free(self) -> int:
        if self._free:
            bid = self._free.popleft()
        else:
            bid, _ = self._evictable.popitem(last=False)  # least recently used
            block = self._blocks[bid]
            if self._by_hash.get(block.hash) == bid:  # type: ignore[arg-type]
                del self._by_hash[block.hash]  # type: ignore[arg-type]
            block.clear()
        self._blocks[bid].ref_count = 1
        return bid

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
        for bid in reversed(req.block_ids):
            block = self._blocks[bid]
            if block.ref_count <= 0:
                raise RuntimeError(f"block {bid} freed with reference count {block.ref_count} "
                                   f"(request {req.request_id!r})")
            block.ref_count -= 1
            if block.ref_count:
                continue
            if block.hash is not None and self._by_hash.setdefault(block.hash, bid) == bid:
                self._evictable[bid] = None  # keep its content for a later hit
            else:
                block.clear()  # partial, uncacheable, or a duplicate of a cached block
                self._free.append(bid)
        req.block_ids = []
        req.num_registered_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix; blocks in use keep serving their requests."""
        for bid in self._evictable:
            self._blocks[bid].clear()
            self._free.append(bid)
        self._evictable.clear()
        self._by_hash.clear()
        for block in self._blocks:
            block.hash = None  # in use: never found again, and not kept once freed

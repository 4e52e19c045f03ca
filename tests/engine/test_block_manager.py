"""Block manager: reference counts, verified prefix hits, LRU eviction, statistics."""

import pytest

from aioengine.engine.block_manager import BlockManager

from .sim_worker import make_request

BS = 4


def admit(bm: BlockManager, rid: str, prompt: list[int]):
    """Admit like the scheduler does, then mark the whole prompt computed and cache it."""
    req = make_request(rid, prompt)
    cached = bm.find_cached_prefix(req)
    assert bm.allocate(req, req.num_tokens - len(cached) * BS, cached)
    req.num_computed_tokens = req.num_tokens
    bm.cache_computed_blocks(req)
    return req, cached


def test_allocate_counts_blocks_and_free_returns_them():
    bm = BlockManager(8, BS)
    req, cached = admit(bm, "a", list(range(10)))  # 3 blocks (4 + 4 + 2)
    assert cached == []
    assert len(req.block_ids) == 3 and bm.num_used_blocks == 3 and bm.num_free_blocks == 5
    assert all(bm.ref_count(b) == 1 for b in req.block_ids)
    bm.free(req)
    assert bm.num_used_blocks == 0 and req.block_ids == []
    bm.free(req)  # idempotent
    assert bm.num_used_blocks == 0


def test_allocation_is_all_or_nothing():
    bm = BlockManager(2, BS)
    req = make_request("a", list(range(9)))  # needs 3 blocks
    assert not bm.allocate(req, 9)
    assert req.block_ids == [] and bm.num_free_blocks == 2


def test_identical_prefix_hits_and_shares_blocks_with_counts():
    bm = BlockManager(16, BS)
    a, _ = admit(bm, "a", list(range(10)))
    b, cached = admit(bm, "b", [*range(8), 50, 51, 52])
    assert cached == a.block_ids[:2]
    assert b.num_computed_tokens == 11 and b.num_cached_tokens == 8
    assert [bm.ref_count(x) for x in cached] == [2, 2]
    assert bm.num_used_blocks == 3 + 1  # b added only its third block
    assert bm.hit_rate == pytest.approx(8 / (10 + 11))
    bm.free(a)
    assert [bm.ref_count(x) for x in cached] == [1, 1]
    bm.free(b)
    assert [bm.ref_count(x) for x in cached] == [0, 0]
    assert bm.num_used_blocks == 0


def test_hit_leaves_the_last_token_to_compute():
    bm = BlockManager(16, BS)
    admit(bm, "a", list(range(8)))
    req = make_request("b", list(range(8)))  # fully cached, but the last token is recomputed
    assert len(bm.find_cached_prefix(req)) == 1
    req = make_request("c", list(range(9)))
    assert len(bm.find_cached_prefix(req)) == 2


def test_hash_collision_is_rejected_by_token_check():
    bm = BlockManager(16, BS)
    a, _ = admit(bm, "a", list(range(9)))
    other = make_request("b", [7, 7, 7, 7, 7])
    other.block_hashes = list(a.block_hashes)  # pretend its hashes collide with a's
    assert bm.find_cached_prefix(other) == []


def test_different_prefix_same_block_tokens_is_not_a_hit():
    bm = BlockManager(16, BS)
    admit(bm, "a", [1, 1, 1, 1, 2, 2, 2, 2, 0])
    req = make_request("b", [9, 9, 9, 9, 2, 2, 2, 2, 0])  # second block equal, prefix not
    assert bm.find_cached_prefix(req) == []


def test_freed_blocks_stay_cached_until_needed_then_lru_evicts_oldest():
    bm = BlockManager(6, BS)
    a, _ = admit(bm, "a", [*range(100, 108), 0])  # 3 blocks, 2 cacheable
    b, _ = admit(bm, "b", [*range(200, 208), 0])
    bm.free(a)
    bm.free(b)  # LRU (oldest first): a's blocks, then b's; never-cached blocks are reused first
    assert bm.num_cached_blocks == 4 and bm.num_free_blocks == 6
    c = make_request("c", list(range(300, 309)))
    assert bm.allocate(c, 9)  # 3 blocks: 2 never-cached ones, then a's tail block
    assert bm.num_cached_blocks == 3
    again_a = make_request("a2", [*range(100, 108), 1])
    assert len(bm.find_cached_prefix(again_a)) == 1  # head of a survives its tail
    again_b = make_request("b2", [*range(200, 208), 1])
    assert len(bm.find_cached_prefix(again_b)) == 2


def test_hit_refreshes_lru_position():
    bm = BlockManager(4, BS)
    a, _ = admit(bm, "a", [1, 2, 3, 4, 0])
    b, _ = admit(bm, "b", [5, 6, 7, 8, 0])
    bm.free(a)
    bm.free(b)
    a2, cached = admit(bm, "a2", [1, 2, 3, 4, 9])  # touches a's block
    assert len(cached) == 1
    bm.free(a2)  # now b's block is the least recently used
    big = make_request("big", list(range(12)))
    assert bm.allocate(big, 12)  # 2 uncached + 1 evicted
    assert len(bm.find_cached_prefix(make_request("x", [1, 2, 3, 4, 0]))) == 1
    assert bm.find_cached_prefix(make_request("y", [5, 6, 7, 8, 0])) == []


def test_reviving_a_cached_block_costs_a_free_block():
    bm = BlockManager(2, BS)
    a, _ = admit(bm, "a", [1, 2, 3, 4, 5])
    bm.free(a)
    req = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    cached = bm.find_cached_prefix(req)
    assert len(cached) == 1
    assert not bm.allocate(req, 5, cached)  # 1 revived + 2 new > 2 free
    assert bm.ref_count(cached[0]) == 0 and bm.num_free_blocks == 2


def test_duplicate_content_computed_twice_is_shared_afterwards():
    bm = BlockManager(8, BS)
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    for r in (a, b):  # both admitted before either was computed: no hits
        assert bm.find_cached_prefix(r) == []
        assert bm.allocate(r, 9)
    for r in (a, b):
        r.num_computed_tokens = 9
        bm.cache_computed_blocks(r)
    c = make_request("c", [1, 2, 3, 4, 5, 6, 7, 8, 0, 0])
    canonical = a.block_ids[:2]
    assert bm.find_cached_prefix(c) == canonical
    bm.free(a)  # the cached copy is kept, b's copy dropped when b goes
    bm.free(b)
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 8
    assert bm.find_cached_prefix(c) == canonical


def test_reset_prefix_cache_forgets_everything_but_keeps_blocks_in_use():
    bm = BlockManager(8, BS)
    a, _ = admit(bm, "a", list(range(9)))
    b, _ = admit(bm, "b", list(range(100, 109)))
    bm.free(b)
    bm.reset_prefix_cache()
    assert bm.num_cached_blocks == 0 and bm.num_used_blocks == 3
    assert bm.find_cached_prefix(make_request("c", list(range(9)))) == []
    bm.free(a)
    assert bm.num_cached_blocks == 0 and bm.num_used_blocks == 0  # not re-cached on free


def test_over_free_is_detected():
    bm = BlockManager(4, BS)
    a, _ = admit(bm, "a", [1, 2, 3])
    stale = list(a.block_ids)
    bm.free(a)
    a.block_ids = stale  # a bookkeeping bug elsewhere must not drive a count negative
    with pytest.raises(RuntimeError, match="reference count 0"):
        bm.free(a)


def test_invalid_sizes_rejected():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 16)


def test_collision_with_same_tokens_under_another_prefix_is_rejected():
    bm = BlockManager(16, BS)
    admit(bm, "a", [1, 1, 1, 1, 2, 2, 2, 2, 0])  # caches blocks [1]*4 and [2]*4 after it
    b = make_request("b", [1, 1, 1, 1, 3, 3, 3, 3, 0])
    assert len(bm.find_cached_prefix(b)) == 1  # computes b's hashes; its second block misses
    c = make_request("c", [7, 7, 7, 7, 3, 3, 3, 3, 0])
    c.block_hashes = [12345, b.block_hashes[1]]  # c's second block collides with b's
    admit(bm, "c", c.token_ids)  # (a fresh request with the real hashes, for contrast)
    cached = bm.find_cached_prefix(c)
    assert bm.allocate(c, 9 - len(cached) * BS, cached)
    c.num_computed_tokens = 9
    bm.cache_computed_blocks(c)
    # Same tokens [3]*4, same hash, but it hangs off [7]*4, not off b's [1]*4:
    assert len(bm.find_cached_prefix(b)) == 1

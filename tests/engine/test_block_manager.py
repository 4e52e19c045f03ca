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


def test_freed_blocks_stay_cached_until_a_run_takes_the_older_half_of_the_lru():
    bm = BlockManager(6, BS)
    a, _ = admit(bm, "a", [*range(100, 108), 0])  # run 0..2, blocks 3..4 reserved to grow
    b, _ = admit(bm, "b", [*range(200, 208), 0])  # no run of 3 left: single blocks 5, 3, 4
    assert a.block_ids == [0, 1, 2] and b.block_ids == [5, 3, 4]
    bm.free(a)
    bm.free(b)  # LRU (oldest first): a's tail, a's head, b's blocks 3 then 5
    assert bm.num_cached_blocks == 4 and bm.num_free_blocks == 6
    c = make_request("c", list(range(300, 309)))
    assert bm.allocate(c, 9)
    assert c.block_ids == [0, 1, 2]  # a run over a's old blocks, not scattered free ones
    assert bm.num_cached_blocks == 2
    assert bm.find_cached_prefix(make_request("a2", [*range(100, 108), 1])) == []
    assert len(bm.find_cached_prefix(make_request("b2", [*range(200, 208), 1]))) == 2


def test_without_a_run_never_cached_blocks_go_first_then_the_lru_oldest():
    bm = BlockManager(6, BS)
    a, _ = admit(bm, "a", [*range(100, 108), 0])
    b, _ = admit(bm, "b", [*range(200, 208), 0])
    bm.free(a)
    bm.free(b)  # cached 0, 1, 3, 5 (LRU: 1, 0, 3, 5); never-cached 2, 4
    pin = make_request("pin", [9])
    assert bm.allocate(pin, 1) and pin.block_ids == [2]  # one block: a never-cached one
    c = make_request("c", list(range(300, 309)))  # no run of 3 is possible any more
    assert bm.allocate(c, 9)
    assert c.block_ids == [4, 1, 0]  # the never-cached block, then the LRU's oldest two
    assert len(bm.find_cached_prefix(make_request("b2", [*range(200, 208), 1]))) == 2


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


def _is_run(ids: list[int]) -> bool:
    return ids == list(range(ids[0], ids[0] + len(ids)))


def test_admission_takes_a_run_and_reserves_room_to_grow():
    bm = BlockManager(32, BS)
    a = make_request("a", list(range(9)), max_tokens=8)  # 17 tokens: 5 blocks in all
    assert bm.allocate(a, 9) and a.block_ids == [0, 1, 2]
    b = make_request("b", list(range(5)), max_tokens=4)
    assert bm.allocate(b, 5) and b.block_ids == [5, 6]  # after a's reserved blocks 3, 4
    assert bm.num_free_blocks == 32 - 5  # reserved blocks still count as free
    a.num_computed_tokens = 9
    assert bm.allocate(a, 8) and a.block_ids == [0, 1, 2, 3, 4]  # grew into its reservation
    b.num_computed_tokens = 5
    assert bm.allocate(b, 3) and _is_run(b.block_ids)


def test_best_fit_keeps_long_stretches_whole():
    bm = BlockManager(16, BS)
    reqs = [make_request(f"r{i}", [i] * 8, max_tokens=1) for i in range(5)]
    for r in reqs:  # 3 blocks each (9 tokens), back to back: 0..14, block 15 free
        assert bm.allocate(r, 8)
    bm.free(reqs[1])
    bm.free(reqs[3])
    bm.reset_prefix_cache()  # free stretches: 3..5, 9..11 and block 15
    small = make_request("s", [7], max_tokens=3)  # 1 block: the single free block fits best
    assert bm.allocate(small, 1) and small.block_ids == [15]
    mid = make_request("m", list(range(9)), max_tokens=1)  # 3 blocks: the first stretch of 3
    assert bm.allocate(mid, 9) and mid.block_ids == [3, 4, 5]
    late = make_request("l", list(range(9)), max_tokens=1)
    assert bm.allocate(late, 9) and late.block_ids == [9, 10, 11]


def test_a_stolen_reservation_breaks_only_that_run_and_freeing_releases_it():
    bm = BlockManager(6, BS)
    a = make_request("a", list(range(4)), max_tokens=12)  # 1 block now, 4 in all: 1..3 kept
    assert bm.allocate(a, 4) and a.block_ids == [0]
    b = make_request("b", list(range(9)), max_tokens=1)  # 3 blocks: only 4, 5 are unreserved
    assert bm.allocate(b, 9)
    assert b.block_ids == [4, 5, 1]  # no run: never-cached blocks, then a reserved one
    a.num_computed_tokens = 4
    assert bm.allocate(a, 4) and a.block_ids == [0, 2]  # its next block was taken
    bm.free(a)
    assert bm.num_free_blocks == 3
    c = make_request("c", list(range(9)), max_tokens=1)  # a's blocks and reservation are back
    assert bm.allocate(c, 9) and c.block_ids == [0, 2, 3]


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_release_before_window_frees_leading_blocks_once(prefix_caching):
    """Window 6 at 18 computed tokens: the next query (position 18) sees keys 13..18, so
    blocks 0-2 (positions 0-11) are dead; with prefix caching the last registered block stays
    (the next one registered takes its content id as parent)."""
    bm = BlockManager(16, BS, enable_prefix_caching=prefix_caching)
    req, _ = admit(bm, "a", list(range(18)))  # 5 blocks
    ids = list(req.block_ids)
    assert bm.release_before_window(req, 6) == 3
    assert req.block_ids == [0, 0, 0, *ids[3:]] and req.num_window_freed == 3
    assert bm.num_used_blocks == 2
    assert all(bm.ref_count(b) == 0 for b in ids[:3])
    assert bm.release_before_window(req, 6) == 0  # idempotent
    req.token_ids.extend(range(18, 24))  # (decodes appended tokens)
    assert bm.allocate(req, 6) and len(req.block_ids) == 6
    req.num_computed_tokens = 24
    bm.cache_computed_blocks(req)
    # Keys from 19 on: block 3 (12-15) is dead too, but with prefix caching block 5 was just
    # registered, so the cap is its parent's index 4: block 3 goes either way.
    assert bm.release_before_window(req, 6) == 1
    live = req.block_ids[4:]
    assert bm.num_cached_blocks == (6 if prefix_caching else 0)
    bm.free(req)  # skips the placeholders: no double release of block 0
    assert bm.num_used_blocks == 0 and req.num_window_freed == 0
    if prefix_caching:  # the chain registered across the freed blocks is still a valid prefix
        again = make_request("b", [*range(24), 99])
        assert bm.find_cached_prefix(again) == ids[:4] + live

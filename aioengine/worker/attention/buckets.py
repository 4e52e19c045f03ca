"""Decode length buckets: which one-token chunks are padded together in one gather + SDPA.

Padding every decode to the step's longest context made attention do ~2x the useful work for
lengths spread evenly; each extra bucket costs a few more calls in every layer instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

# What one more decode bucket costs (its gather, SDPA and slicing in every layer, its masks once
# per step), in padded key positions: a split pays off when it saves more padding than this.
DECODE_BUCKET_COST = 128


def decode_buckets(ids: list[int], nblocks: Sequence[int], block_size: int,
                   cost: int = DECODE_BUCKET_COST) -> list[list[int]]:
    """Split the decode chunks ``ids`` (``nblocks[i]`` blocks of context each) into buckets
    minimising the padded key positions (each bucket pads to its longest) plus ``cost`` per
    bucket. One bucket keeps ``ids``' order (a pure decode step then needs no scatter).

    Sorted by length, optimal buckets are runs, and a boundary never splits equal lengths, so
    this is a 1-D partition over the U distinct lengths: ``f[g] = min_h f[h] + (c_g - c_h) *
    x_g + cost`` (``c``: sequences up to length group g, ``x_g``: its padded length). The
    convex hull trick solves it in O(U): lines ``f[h] - c_h * x`` have falling slopes and the
    queries ``x_g`` rise.
    """
    if len(ids) <= 1:
        return [ids] if ids else []
    order = sorted(ids, key=nblocks.__getitem__)
    ends: list[int] = []  # sequences in length groups 0..g
    xs: list[int] = []  # padded keys per sequence in group g
    for pos, i in enumerate(order, 1):
        if xs and xs[-1] == nblocks[i] * block_size:
            ends[-1] = pos
        else:
            xs.append(nblocks[i] * block_size)
            ends.append(pos)
    if len(xs) == 1:
        return [ids]
    counts, best, parent = [0], [0], [0]  # per DP state: sequences covered, cost, split
    hull = [0]  # states whose lines form the lower envelope, slopes -counts falling
    head = 0
    for end, x in zip(ends, xs, strict=True):
        while (head + 1 < len(hull) and best[hull[head + 1]] - counts[hull[head + 1]] * x
               <= best[hull[head]] - counts[hull[head]] * x):
            head += 1
        h = hull[head]
        counts.append(end)
        best.append(best[h] + (end - counts[h]) * x + cost)
        parent.append(h)
        k = len(best) - 1
        while len(hull) - head >= 2 and _hides(counts, best, hull[-2], hull[-1], k):
            hull.pop()
        hull.append(k)
    cuts = []
    state = len(best) - 1
    while state:
        cuts.append(counts[state])
        state = parent[state]
    if len(cuts) == 1:
        return [ids]
    bounds = [0, *reversed(cuts)]
    return [order[lo:hi] for lo, hi in pairwise(bounds)]


def _hides(counts: list[int], best: list[int], a: int, b: int, c: int) -> bool:
    """Line b is nowhere below both a and c (slopes -counts[a] > -counts[b] > -counts[c]):
    c overtakes a no later than b does."""
    return ((best[c] - best[a]) * (counts[b] - counts[a])
            <= (best[b] - best[a]) * (counts[c] - counts[a]))

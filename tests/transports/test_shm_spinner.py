"""The shm spin budget: learned from sleeps, halved by failures, restored by a probe that pays,
bounded above, and zero (no spinning at all) for an idle or slow peer."""

from __future__ import annotations

import time

from transports.shm.waiting import (
    PROBE_EVERY,
    SPIN_MAX_NS,
    SPIN_MIN_NS,
    SPIN_START_NS,
    Spinner,
)


def never() -> bool:
    return False


def after(calls: int):
    """A condition that turns true on its ``calls``-th check."""
    left = [calls]

    def ready() -> bool:
        left[0] -= 1
        return left[0] <= 0

    return ready


def test_failed_spin_halves_the_budget_and_counts_a_miss() -> None:
    s = Spinner()
    assert s.budget == SPIN_START_NS
    assert not s.spin(never)
    assert (s.budget, s.misses) == (SPIN_START_NS // 2, 1)


def test_failed_spin_spends_about_its_budget() -> None:
    s = Spinner()
    s.budget = 2_000_000  # 2 ms: long enough to time on a busy machine
    t0 = time.monotonic_ns()
    assert not s.spin(never)
    assert time.monotonic_ns() - t0 >= 2_000_000


def test_successful_spin_keeps_its_budget_and_clears_misses() -> None:
    s = Spinner()
    s.misses = 3
    assert s.spin(after(5))
    assert (s.budget, s.misses) == (SPIN_START_NS, 0)


def test_budget_decays_to_zero_and_then_no_spin_happens() -> None:
    s = Spinner()
    while s.budget:
        assert not s.spin(never)
    calls = [0]

    def counted() -> bool:
        calls[0] += 1
        return False

    assert not s.spin(counted)
    assert calls[0] == 0  # a zero budget does not even look


def test_short_sleep_teaches_twice_its_length() -> None:
    s = Spinner()
    s.slept(80_000)  # a sleep that ended with progress after 80 us (a halted vCPU's wake-up)
    assert s.budget == s.learned == 160_000


def test_learned_budget_is_bounded() -> None:
    s = Spinner()
    s.slept(SPIN_MAX_NS - 1)
    assert s.budget == s.learned == SPIN_MAX_NS


def test_long_sleep_teaches_nothing() -> None:
    s = Spinner()
    assert not s.spin(never)
    s.slept(SPIN_MAX_NS)  # a slow peer: spinning that long is not worth it
    assert (s.budget, s.learned) == (SPIN_START_NS // 2, SPIN_START_NS)


def test_failing_spins_shrink_what_a_short_sleep_teaches() -> None:
    # Spins failing while the peer answers quickly: it shares our core and cannot run while
    # we spin, so the grown budget is halved once per failure in a row.
    s = Spinner()
    for _ in range(3):
        assert not s.spin(never)
    s.slept(100_000)
    assert s.learned == 200_000
    assert s.budget == 200_000 >> 3


def test_tiny_grown_budget_is_zero() -> None:
    s = Spinner()
    while s.budget:
        s.spin(never)
    s.slept(SPIN_MIN_NS // 4)
    assert s.budget == 0


def test_probe_spins_the_learned_length_and_success_restores_the_budget() -> None:
    s = Spinner()
    s.slept(100_000)
    while s.budget:  # the peer stopped answering while we spin: budget to 0
        assert not s.spin(never)
    misses = s.misses
    probed = 0
    for _ in range(PROBE_EVERY):
        if s.spin(after(3)):
            probed += 1
            break
    assert probed == 1  # exactly one of every PROBE_EVERY waits spins at all
    assert (s.budget, s.misses) == (200_000, 0)
    assert misses > 0
    assert s.spin(after(3))  # and spinning resumes for every wait, not just probes


def test_failed_probe_keeps_backing_off() -> None:
    s = Spinner()
    s.slept(100_000)
    while s.budget:
        assert not s.spin(never)
    misses = s.misses
    for _ in range(PROBE_EVERY):
        assert not s.spin(never)
    assert s.misses == misses + 1
    assert s.budget == 0  # a failed probe costs one spin, not a new decay from its length

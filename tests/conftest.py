"""Project-wide test set-up: a shared model cache, and a leak check around every test.

Every test (and every test module, for module-scoped fixtures) fails if it leaves a child
process, a new /dev/shm entry or a new ``aioengine-*`` entry in the temp dir behind; leftovers
are killed/removed after being reported. See tests/runtime/leaks.py.
"""

from __future__ import annotations

import os

import pytest

from tests.runtime.leaks import LeakSnapshot

pytest_plugins = ["pytester"]

TEST_CACHE = "/tmp/aioengine-test-cache"


def pytest_configure(config: pytest.Config) -> None:
    # Before anything spawns: children inherit it. Built-in models are written here once and
    # reused across the session (and later sessions).
    os.environ.setdefault("AIOENGINE_CACHE", TEST_CACHE)


@pytest.fixture(scope="session")
def aioengine_cache() -> str:
    """The model cache directory the tests share ($AIOENGINE_CACHE)."""
    return os.environ["AIOENGINE_CACHE"]


def _check(snapshot: LeakSnapshot, what: str) -> None:
    problems = snapshot.finish()
    if problems:
        pytest.fail(f"{what} leaked (now cleaned up):\n  " + "\n  ".join(problems)
                    + "\n(on a machine shared with other test runs, an unheld file of theirs "
                    "can show up here too)", pytrace=False)


@pytest.fixture(autouse=True, scope="module")
def _no_leaks_per_module(request: pytest.FixtureRequest):
    snapshot = LeakSnapshot(ignore={os.environ["AIOENGINE_CACHE"]})
    yield
    _check(snapshot, f"module {request.module.__name__} (its fixtures)")


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest):
    snapshot = LeakSnapshot(ignore={os.environ["AIOENGINE_CACHE"]})
    yield
    _check(snapshot, request.node.nodeid)

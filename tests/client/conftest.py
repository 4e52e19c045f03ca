from __future__ import annotations

import pytest
from tokenizers import Tokenizer

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

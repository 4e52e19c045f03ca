"""The embedding and rerank routes on a generation model (the shared tiny engine): a 400
``model_not_supported`` in OpenAI's shape, saying what the model does; nothing reaches the
engine."""

from __future__ import annotations

import aiohttp
import pytest

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/embeddings", {"input": "hello"}),
    ("/v1/rerank", {"query": "q", "documents": ["a"]}),
    ("/v2/rerank", {"query": "q", "documents": ["a"]}),
    ("/score", {"text_1": "a", "text_2": "b"}),
])
async def test_a_generation_model_refuses_pooling_requests(server, engine, path, body):
    before = (await engine.get_stats()).prompt_tokens_total
    async with aiohttp.ClientSession() as s, s.post(server.make_url(path), json=body) as r:
        err = (await r.json())["error"]
    assert r.status == 400
    assert err["code"] == "model_not_supported" and err["param"] == "model"
    assert "generates text" in err["message"]
    assert (await engine.get_stats()).prompt_tokens_total == before

"""The real sentence embedder (all-MiniLM-L6-v2, from the package index) through the Python API
and ``POST /v1/embeddings``. The oracle is sentence-transformers' pipeline for this model on
the same weights, spelled out with transformers (its files say: BertModel, mean pooling over
the input's tokens, normalized, inputs cut at 256 tokens)."""

from __future__ import annotations

import asyncio
import base64
import functools
import struct

import aiohttp
import pytest

from aioengine import AsyncMPClient, EngineConfig
from aioengine.hub import resolve_model
from tests.server.app_server import app_server, openai_client

pytestmark = pytest.mark.anyio

MODEL = "all-minilm-l6-v2"

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    " ",
    "नमस्ते दुनिया, यह एक परीक्षण वाक्य है।",  # Devanagari: vowel signs must survive
    "这是一个用于测试的中文句子。",
    "مرحبا بالعالم",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "I love this 😀🎉 so much!!!",
    " ".join(["The sea rolls in under a grey sky and the gulls cry over the harbour."] * 30),
]


@pytest.fixture(scope="module")
async def embedder(anyio_backend: str):
    async with AsyncMPClient(EngineConfig(model=MODEL, device="cpu")) as client:
        yield client


@functools.cache
def _oracle():
    import torch
    from transformers import AutoTokenizer, BertModel

    path = resolve_model(MODEL).model_path
    return AutoTokenizer.from_pretrained(path), BertModel.from_pretrained(path).eval(), torch


@functools.cache
def reference(text: str) -> tuple[list[int], list[float]]:
    tok, model, torch = _oracle()
    enc = tok(text, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        states = model(**enc).last_hidden_state[0]
    vec = torch.nn.functional.normalize(states.mean(0), dim=0)
    return enc["input_ids"][0].tolist(), vec.tolist()


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


async def test_embeddings_match_sentence_transformers(embedder):
    """Every input of a varied set, sent concurrently (the engine batches them), gives the
    reference's tokens and vector (cosine >= 0.999); the long one is cut at 256 tokens."""
    outs = await asyncio.gather(*(embedder.embed(t) for t in TEXTS))
    for text, out in zip(TEXTS, outs, strict=True):
        ids, vec = reference(text)
        assert out.prompt_token_ids == ids, text
        assert len(out.embedding) == 384
        assert cosine(out.embedding, vec) >= 0.999, text
    assert len(outs[-1].prompt_token_ids) == 256
    # token ids in, the same vector out
    again = await embedder.embed(outs[1].prompt_token_ids)
    assert cosine(again.embedding, outs[1].embedding) > 0.99999


async def test_python_api_refuses_bad_inputs(embedder):
    for bad, needle in [("", "empty string"), ([], "empty list"),
                        ([10**6], "must be an integer in"), (3.5, "must be a string")]:
        with pytest.raises(ValueError, match=needle):
            await embedder.embed(bad)
    with pytest.raises(ValueError, match="more than the model's 256"):
        await embedder.embed(TEXTS[-1], truncate=False)
    with pytest.raises(ValueError, match="not trained to be shortened"):
        await embedder.embed("hi", dimensions=128)
    with pytest.raises(ValueError, match="embedding model"):
        async for _ in embedder.generate("hi"):
            pass
    short = await embedder.embed(TEXTS[-1], truncate=16)
    assert len(short.prompt_token_ids) == 16 and short.prompt_token_ids[-1] == 102  # [SEP]


async def test_http_embeddings_with_the_openai_sdk(embedder):
    async with app_server(embedder) as srv:
        async with openai_client(srv) as oai:
            # the SDK asks for base64 and decodes it itself
            resp = await oai.embeddings.create(model=MODEL, input=TEXTS[:3])
        assert [d.index for d in resp.data] == [0, 1, 2]
        assert resp.usage.prompt_tokens == sum(len(reference(t)[0]) for t in TEXTS[:3])
        for d, text in zip(resp.data, TEXTS[:3], strict=True):
            assert cosine(d.embedding, reference(text)[1]) >= 0.999
        async with aiohttp.ClientSession() as s:
            url = srv.make_url("/v1/embeddings")
            async with s.post(url, json={"input": "hello world"}) as r:
                body = await r.json()
            assert r.status == 200 and body["object"] == "list" and body["model"] == MODEL
            floats = body["data"][0]["embedding"]
            async with s.post(url, json={"input": [[101, 7592, 2088, 102]],
                                         "encoding_format": "base64"}) as r:
                packed = base64.b64decode((await r.json())["data"][0]["embedding"])
            assert cosine(list(struct.unpack(f"<{len(packed) // 4}f", packed)), floats) > 0.99999


async def test_http_bad_inputs_get_400s_naming_the_field(embedder):
    cases = [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["ok", 5]}, "input[1]"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": [[1, 2], [10**7]]}, "input[1]"),
        ({"input": "hi", "dimensions": 100}, "dimensions"),
        ({"input": TEXTS[-1], "truncate": "NONE"}, "input"),
        ({"input": "hi", "truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ]
    async with app_server(embedder) as srv, aiohttp.ClientSession() as s:
        for body, param in cases:
            async with s.post(srv.make_url("/v1/embeddings"), json=body) as r:
                err = (await r.json())["error"]
            assert r.status == 400 and err["param"] == param, (body, err)
            assert err["type"] == "invalid_request_error" and err["message"]
        async with s.post(srv.make_url("/v1/embeddings"),
                          json={"input": "hi", "model": "nope"}) as r:
            assert r.status == 404
        async with s.post(srv.make_url("/v1/chat/completions"),
                          json={"messages": [{"role": "user", "content": "hi"}]}) as r:
            err = (await r.json())["error"]
        assert r.status == 400 and "embedding model" in err["message"]
        # nothing stalled: a good request is answered
        async with s.post(srv.make_url("/v1/embeddings"), json={"input": "still here"}) as r:
            assert r.status == 200
        async with s.get(srv.make_url("/metrics")) as r:
            metrics = await r.text()
        assert (f'aioengine_requests_total{{endpoint="embeddings",model="{MODEL}",'
                f'outcome="rejected"}} {len(cases) + 1}.0') in metrics  # and the 404
        assert (f'aioengine_requests_total{{endpoint="embeddings",model="{MODEL}",'
                'outcome="stop"} 1.0') in metrics
    stats = await embedder.get_stats()
    assert stats.num_running == stats.num_waiting == 0 and stats.kv_blocks_used == 0


async def test_langchain_openai_embeddings(embedder):
    """LangChain's ``OpenAIEmbeddings`` pointed at the server, unchanged but for the setting
    every OpenAI-compatible server needs (``check_embedding_ctx_length=False``: otherwise it
    sends OpenAI's own tiktoken ids)."""
    import httpx
    from langchain_openai import OpenAIEmbeddings

    # Our own HTTP client, closed here: the SDK's default one closes itself when collected,
    # on whatever event loop runs then (a later test module's), and that loop's tests fail.
    async with app_server(embedder) as srv, httpx.AsyncClient() as http:
        lc = OpenAIEmbeddings(model=MODEL, base_url=str(srv.make_url("/v1")), api_key="unused",
                              check_embedding_ctx_length=False, max_retries=0,
                              http_async_client=http)
        docs = await lc.aembed_documents(TEXTS[:2])
        query = await lc.aembed_query(TEXTS[0])
    assert cosine(docs[0], reference(TEXTS[0])[1]) >= 0.999
    assert cosine(docs[1], reference(TEXTS[1])[1]) >= 0.999
    assert cosine(query, docs[0]) > 0.99999

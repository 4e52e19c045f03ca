"""The official ``openai`` package against the app on loopback, over a real engine."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Tell me about the sea."}]


async def test_models_lists_the_served_model(oai):
    models = await oai.models.list()
    assert [m.id for m in models.data] == ["tiny"]


async def test_models_retrieve_the_served_model(oai):
    import openai

    model = await oai.models.retrieve("tiny")
    assert model.id == "tiny" and model.object == "model"
    with pytest.raises(openai.NotFoundError) as err:
        await oai.models.retrieve("gpt-4")
    assert err.value.body["code"] == "model_not_found"
    assert "'gpt-4'" in err.value.body["message"]


async def test_chat_non_streaming_with_usage(oai):
    r = await oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8,
                                          temperature=0.0, logprobs=True)
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= r.usage.completion_tokens <= 8
    assert r.usage.prompt_tokens > 10  # the chat template wraps both messages
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # One logprob per generated token: usage counts what was really generated.
    assert len(choice.logprobs.content) == r.usage.completion_tokens
    assert all(e.logprob <= 0.0 for e in choice.logprobs.content)


async def test_chat_streaming_equals_non_streaming(oai):
    kwargs = dict(model="tiny", messages=MESSAGES, max_completion_tokens=12, temperature=0.0)
    whole = await oai.chat.completions.create(**kwargs)
    stream = await oai.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    # include_usage: a last chunk with no choices and the usage; none before it.
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


async def test_completions_streaming_and_not(oai):
    kwargs = dict(model="tiny", prompt="The capital of France is", max_tokens=10,
                  temperature=0.0)
    whole = await oai.completions.create(**kwargs)
    assert whole.object == "text_completion"
    assert whole.choices[0].logprobs is None  # not asked for
    assert 1 <= whole.usage.completion_tokens <= 10
    stream = await oai.completions.create(**kwargs, stream=True,
                                          stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_completion_from_token_ids_with_logprobs(oai):
    r = await oai.completions.create(model="tiny", prompt=[5, 17, 42, 99], max_tokens=5,
                                     temperature=0.0, logprobs=2,
                                     extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 4 and r.usage.completion_tokens == 5
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
    assert r.choices[0].finish_reason == "length"


async def test_max_tokens_is_honoured_exactly(oai):
    r = await oai.chat.completions.create(model="tiny", messages=MESSAGES,
                                          max_completion_tokens=3,
                                          extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


async def test_stop_string_cuts_the_text(oai):
    base = dict(model="tiny", prompt="Once upon a time", max_tokens=24, temperature=0.0,
                extra_body={"ignore_eos": True})
    full = (await oai.completions.create(**base)).choices[0].text
    stop = next((full[i:i + 2] for i in range(4, len(full) - 2)
                 if full[i:i + 2].strip() == full[i:i + 2]), None)
    assert stop, f"no usable stop string in {full!r}"
    r = await oai.completions.create(**base, stop=[stop, "\x00never"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index(stop)]


async def test_seed_reproduces_and_differs(oai):
    async def sample(seed: int) -> str:
        r = await oai.completions.create(model="tiny", prompt="Seeds", max_tokens=12,
                                         temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True})
        return r.choices[0].text

    first = await sample(1234)
    assert await sample(1234) == first
    others = {await sample(s) for s in (1, 2, 3)}
    assert others - {first}, "different seeds all gave the same text"


async def test_n_choices_each_with_own_seed(oai):
    r = await oai.chat.completions.create(model="tiny", messages=MESSAGES, n=3, max_tokens=6,
                                          temperature=1.0, seed=7,
                                          extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 18
    assert len({c.message.content for c in r.choices}) > 1
    again = await oai.chat.completions.create(model="tiny", messages=MESSAGES, n=3,
                                              max_tokens=6, temperature=1.0, seed=7,
                                              extra_body={"ignore_eos": True})
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]


async def test_n_choices_stream(oai):
    stream = await oai.chat.completions.create(model="tiny", messages=MESSAGES, n=2,
                                               max_tokens=5, stream=True, seed=3,
                                               extra_body={"ignore_eos": True})
    texts = {0: "", 1: ""}
    finished = {}
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert finished == {0: "length", 1: "length"}
    assert all(texts.values())

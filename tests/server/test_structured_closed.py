"""Pydantic schemas as pydantic writes them (no ``additionalProperties``) on the tiny model's
random weights: every choice is JSON with exactly the declared keys and ends with ``stop``,
through ``response_format`` with n > 1 and through ``SamplingParams.structured_outputs``.
Before objects were closed by default, a weak model wrote keys of its own until
``max_tokens``."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import aiohttp
import pytest
from pydantic import BaseModel, Field

from aioengine import SamplingParams, StructuredOutputs

pytestmark = pytest.mark.anyio

SEEDS = (1, 2, 3)
MAX_TOKENS = 400  # well past the longest output the bounds below allow


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)


class Address(BaseModel):
    street: str = Field(max_length=8)
    city: str | None = Field(default=None, max_length=6)


class Person(BaseModel):
    name: str = Field(max_length=8)
    nickname: str | None = Field(default=None, max_length=5)
    address: Address
    pets: list[Pet] = Field(max_length=2)
    best_friend: Pet | None = None


SCHEMA = Person.model_json_schema()


def test_the_schema_is_pydantics_own_and_says_nothing_of_other_keys() -> None:
    text = json.dumps(SCHEMA)
    assert "additionalProperties" not in text
    assert set(SCHEMA["$defs"]) == {"Address", "Pet"}


def check(text: str, finish_reason: str | None) -> None:
    assert finish_reason == "stop", (finish_reason, text)
    value = json.loads(text)
    person = Person.model_validate(value)
    # Unknown keys are dropped by the model (extra="ignore") and unset fields left out of the
    # dump: equal only if every object held its declared keys and no others, at every depth.
    assert person.model_dump(mode="json", exclude_unset=True) == value, text


async def test_response_format_with_n_choices_gives_exactly_the_declared_keys(server) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    async with aiohttp.ClientSession() as s:
        for seed in SEEDS:
            async with s.post(server.make_url("/v1/chat/completions"), json={
                    "messages": [{"role": "user", "content": "A person as JSON."}],
                    "response_format": rf, "n": 3, "seed": seed, "temperature": 1.0,
                    "max_tokens": MAX_TOKENS}) as resp:
                body = await resp.json()
                assert resp.status == 200, body
            assert len(body["choices"]) == 3
            for choice in body["choices"]:
                check(choice["message"]["content"], choice["finish_reason"])


async def test_structured_outputs_in_sampling_params_gives_exactly_the_declared_keys(
        engine) -> None:
    async def one(seed: int) -> tuple[str, str | None]:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=seed,
                                structured_outputs=StructuredOutputs(json=SCHEMA))
        outs = [out async for out in engine.generate("person:", params)]
        return outs[-1].text, outs[-1].finish_reason

    for text, finish_reason in await asyncio.gather(*(one(100 + s) for s in range(6))):
        check(text, finish_reason)


async def test_vllms_disable_additional_properties_is_what_happens_anyway(server) -> None:
    async with aiohttp.ClientSession() as s, s.post(server.make_url("/v1/completions"), json={
            "prompt": "person:", "n": 2, "seed": 9, "temperature": 1.0,
            "max_tokens": MAX_TOKENS, "structured_outputs": {
                "json": SCHEMA, "disable_additional_properties": True}}) as resp:
        body = await resp.json()
        assert resp.status == 200, body
    for choice in body["choices"]:
        check(choice["text"], choice["finish_reason"])

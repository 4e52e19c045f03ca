"""The detokenizer process (``detokenize_in="process"``) passes a request it cannot decode on to
the engine, which answers it with an error: one bad frame must not take every stream down."""

from __future__ import annotations

import pytest

from aioengine import RequestOutput, SamplingParams, SyncMPClient
from tests.client.conftest import tiny_config


@pytest.mark.parametrize(("transport", "backend"), [("uds", "asyncio"), ("shm", "trio")])
def test_invalid_request_fails_alone_through_the_detokenizer_process(transport: str,
                                                                     backend: str) -> None:
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    async def run(client: SyncMPClient) -> tuple[RequestOutput, RequestOutput]:
        ac = client.async_client
        ids, params = ac.prepare("checked, then spoiled", SamplingParams(max_tokens=4))
        params.temperature = -1.0  # after the client's checks: only the engine can refuse it
        bad = [o async for o in ac.generate_prepared(ids, params)][-1]
        good = [o async for o in ac.generate("still served", greedy)][-1]
        return bad, good

    with SyncMPClient(tiny_config(transport, detokenize_in="process"), backend=backend) as client:
        bad, good = client.call_async(run, client)
        assert not client.is_dead
    assert bad.finish_reason == "error" and "temperature" in (bad.error or "")
    assert good.finish_reason == "length" and len(good.token_ids) == 4
    assert good.text == client.tokenizer.decode(good.token_ids)

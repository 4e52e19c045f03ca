"""AsyncMPClient end to end on every transport, and under trio (``mp_client``'s cases):
concurrent streams, cancellation, aborts, stop strings, chat, and input errors raised before
anything is sent."""

from __future__ import annotations

import contextlib
import time

import anyio
import pytest

from aioengine import LLM, AsyncMPClient, RequestOutput, SamplingParams, SyncMPClient
from tests.client.conftest import tiny_config
from tests.client.run_on import gather

N_STREAMS = 200
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def prompts(n: int) -> list[str]:
    words = ["fox", "forest", "river", "stone", "light", "über", "森", "🦊", "night", "song"]
    return [f"Story {i}: the {words[i % 10]} and the {words[(i * 7) % 10]}" + " again" * (i % 5)
            for i in range(n)]


@pytest.fixture(scope="module")
def reference() -> list[RequestOutput]:
    """Greedy outputs from the blocking LLM API (its own engine), the oracle for the streams."""
    with LLM(tiny_config("uds")) as llm:
        return llm.generate(prompts(N_STREAMS), GREEDY, use_tqdm=False)


async def collect(client: AsyncMPClient, prompt: str, params: SamplingParams
                  ) -> tuple[list[RequestOutput], str]:
    outs, text = [], ""
    async for out in client.generate(prompt, params):
        outs.append(out)
        text += out.delta_text
    return outs, text


async def settle(client: AsyncMPClient, timeout: float = 60.0) -> object:
    """Stats once nothing runs or waits (aborts travel asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = await client.get_stats()
        if (stats.num_running, stats.num_waiting) == (0, 0) or time.monotonic() > deadline:
            return stats
        await anyio.sleep(0.05)


def test_concurrent_streams_match_llm(mp_client: SyncMPClient,
                                      reference: list[RequestOutput]) -> None:
    async def run() -> list[tuple[list[RequestOutput], str]]:
        client = mp_client.async_client
        return await gather(*(lambda p=p: collect(client, p, GREEDY)
                              for p in prompts(N_STREAMS)))

    results = mp_client.call_async(run)
    for (outs, text), ref in zip(results, reference, strict=True):
        final = outs[-1]
        assert final.finished and final.finish_reason == "length"
        assert final.token_ids == ref.token_ids and len(final.token_ids) == 8
        assert text == final.text == ref.text
        assert [t for o in outs for t in o.delta_token_ids] == final.token_ids
        assert final.metrics.time_to_first_token is not None
        assert final.prompt_token_ids == ref.prompt_token_ids


def test_cancel_half_frees_everything(mp_client: SyncMPClient) -> None:
    async def run() -> object:
        client = mp_client.async_client
        # The half to cancel runs long enough that no stream can finish before its cancel.
        short = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        long = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
        started = [anyio.Event() for _ in range(40)]
        scopes = [anyio.CancelScope() for _ in range(40)]
        results: list[str] = [""] * 40

        async def consume(i: int) -> None:
            with scopes[i]:
                async for _ in client.generate(prompts(40)[i], long if i % 2 == 0 else short):
                    started[i].set()
                results[i] = "finished"
            if scopes[i].cancelled_caught:
                results[i] = "cancelled"

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(consume, i)
                for e in started[::2]:
                    await e.wait()
                for scope in scopes[::2]:
                    scope.cancel()
        assert results[::2] == ["cancelled"] * 20
        assert results[1::2] == ["finished"] * 20
        return await settle(client)

    stats = mp_client.call_async(run)
    assert (stats.num_running, stats.num_waiting, stats.kv_blocks_used) == (0, 0, 0)


def test_break_and_abort(mp_client: SyncMPClient) -> None:
    async def run() -> tuple[RequestOutput, object]:
        client = mp_client.async_client
        # As long as the context allows: the abort must come before the natural end, which a
        # host loop starved while the engine decodes would otherwise see first.
        params = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
        async for _ in client.generate("break out early", params):
            break  # the generator's cleanup aborts the request
        last = None
        async for out in client.generate("abort me", params, request_id="to-abort"):
            last = out
            if not out.finished:
                await client.abort("to-abort")
        return last, await settle(client)

    last, stats = mp_client.call_async(run)
    assert last.finished and last.finish_reason == "abort"
    assert (stats.num_running, stats.num_waiting, stats.kv_blocks_used) == (0, 0, 0)


def test_closing_a_stream_releases_its_id_at_once(mp_client: SyncMPClient) -> None:
    """``aclose()`` on ``generate``/``chat`` ends the request before it returns (not whenever
    the loop's async-generator finalizer runs): its id is free again at once."""
    async def run() -> list[RequestOutput]:
        client = mp_client.async_client
        long = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
        chat = [{"role": "user", "content": "close me"}]
        firsts = []
        for start in (lambda: client.generate("close me", long, request_id="closed"),
                      lambda: client.chat(chat, long, request_id="closed")):
            stream = start()
            await stream.__anext__()
            await stream.aclose()
            again = start()  # raised "already in use" while the inner stream lingered
            firsts.append(await again.__anext__())
            await again.aclose()
        await settle(client)
        return firsts

    firsts = mp_client.call_async(run)
    assert [o.request_id for o in firsts] == ["closed", "closed"]


def test_id_reused_at_once_after_a_stream_ends_early(mp_client: SyncMPClient) -> None:
    """An id whose stream ended client-side (break, stop string) while the engine still runs it
    may be used again at once: the new request neither collides with the old one in the
    engine, nor receives its in-flight tokens, nor is ended by the abort meant for it."""
    async def run() -> tuple[list[RequestOutput], list[int], object]:
        client = mp_client.async_client
        short = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        alone = [o async for o in client.generate("reuse me", short)][-1].token_ids
        long = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
        finals = []
        for _ in range(3):
            earlier = client.generate("an earlier request", long, request_id="same")
            async with contextlib.aclosing(earlier):
                async for out in earlier:
                    if len(out.token_ids) >= 2:
                        break  # the engine still runs it; the abort goes in the background
            outs = [o async for o in client.generate("reuse me", short, request_id="same")]
            finals.append(outs[-1])
        return finals, alone, await settle(client)

    finals, alone, stats = mp_client.call_async(run)
    for final in finals:
        assert (final.finish_reason, final.error) == ("length", None)
        assert final.token_ids == alone
    assert (stats.num_running, stats.num_waiting, stats.kv_blocks_used) == (0, 0, 0)


def test_stop_string_cuts_text_and_stops_engine(mp_client: SyncMPClient) -> None:
    async def run() -> tuple[str, RequestOutput, str, object]:
        client = mp_client.async_client
        params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        _, full = await collect(client, "The stop string test", params)
        stop = full[len(full) // 2:len(full) // 2 + 3]
        params.stop = [stop]
        params.max_tokens = 200
        outs, text = await collect(client, "The stop string test", params)
        return full, outs[-1], text, await settle(client)

    full, final, text, stats = mp_client.call_async(run)
    stop = final.stop_reason
    assert final.finish_reason == "stop" and isinstance(stop, str) and stop
    assert text == final.text == full[:full.index(stop)]
    assert len(final.token_ids) < 200  # the engine was told to stop
    assert (stats.num_running, stats.num_waiting) == (0, 0)


def test_chat(mp_client: SyncMPClient) -> None:
    messages = [{"role": "user", "content": "Tell me a story about a fox."}]

    async def run() -> list[RequestOutput]:
        return [o async for o in mp_client.async_client.chat(messages, GREEDY)]

    outs = mp_client.call_async(run)
    tok = mp_client.tokenizer
    expected = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    assert outs[-1].prompt_token_ids == expected
    assert outs[-1].finished and len(outs[-1].token_ids) == 8


def test_bad_inputs_raise_before_sending(mp_client: SyncMPClient) -> None:
    async def run() -> tuple[list[str], object, object]:
        client = mp_client.async_client
        before = await settle(client)
        errors = []
        too_long = [5] * (client.max_model_len + 1)
        hold = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
        running = client.generate("hold the id", hold, request_id="dup")
        await running.__anext__()
        bad_params = SamplingParams()
        bad_params.temperature = -1.0
        cases = [("hi", SamplingParams(max_tokens=4), {"request_id": "dup"}),
                 (too_long, None, {}), ("hi", bad_params, {}), ("", None, {}),
                 ([1, 2, 10**9], None, {}), ("hi", None, {"priority": "high"})]
        for prompt, params, kw in cases:
            with pytest.raises(ValueError) as info:
                async for _ in client.generate(prompt, params, **kw):
                    pass
            errors.append(str(info.value))
        await running.aclose()
        after = await settle(client)
        return errors, before, after

    errors, before, after = mp_client.call_async(run)
    assert "already in use" in errors[0]
    assert "max_model_len" in errors[1]
    assert "temperature" in errors[2]
    assert "empty" in errors[3]
    assert "position 2" in errors[4]
    assert "priority" in errors[5]
    # Only the one valid request reached the engine.
    added = after.prompt_tokens_total - before.prompt_tokens_total
    assert added == len(mp_client.tokenizer.encode("hold the id"))


def test_inproc_llm_matches(reference: list[RequestOutput]) -> None:
    """The in-process client (engine core here, no children) gives the same greedy outputs."""
    with LLM(tiny_config(), client="inproc") as llm:
        outs = llm.generate(prompts(N_STREAMS)[:24], GREEDY, use_tqdm=False)
        chat = llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False)
        stop = llm.generate(prompts(1), SamplingParams(max_tokens=50, temperature=0.0,
                                                      ignore_eos=True, stop=[ref_stop(reference)]),
                            use_tqdm=False)[0]
        assert llm.get_stats().num_running == 0
    assert [o.token_ids for o in outs] == [r.token_ids for r in reference[:24]]
    assert [o.text for o in outs] == [r.text for r in reference[:24]]
    assert chat[0].finished and len(chat[0].token_ids) == 8
    assert stop.finish_reason == "stop" and stop.text == reference[0].text.split(
        ref_stop(reference))[0]


def ref_stop(reference: list[RequestOutput]) -> str:
    return reference[0].text[3:6]


def test_llm_argument_errors() -> None:
    from aioengine.client.llm import _as_batch, _params_list

    assert _as_batch("a") == ["a"] and _as_batch([1, 2]) == [[1, 2]]
    assert _as_batch(["a", [1]]) == ["a", [1]]
    with pytest.raises(ValueError, match="non-empty list"):
        _as_batch([])
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        _params_list([SamplingParams(), SamplingParams()], 3)
    with pytest.raises(ValueError, match="'mp' or 'inproc'"):
        LLM(tiny_config(), client="threads")

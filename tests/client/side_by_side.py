"""Run as a script by test_client_host.py, in a fresh interpreter: two clients on different
transports and detokenizer placements, side by side on one uvloop event loop. Prints JSON."""

from __future__ import annotations

import asyncio
import gc
import json
import sys

import psutil
import uvloop

from aioengine import AsyncMPClient, EngineConfig, SamplingParams

PROMPTS = ["Once upon a time", "Il était une fois", "昔々、森に", "🦊 and 🌲"]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


async def run(transport: str, detokenize_in: str, forget: bool,
              pids: list[int]) -> list[dict[str, object]]:
    """With ``forget``, the client is never shut down: its weakref.finalize must clean up."""
    config = EngineConfig(model="tiny", transport=transport, detokenize_in=detokenize_in,
                          num_kv_blocks=128, max_model_len=256)
    client = AsyncMPClient(config)
    await client.start()
    pids.extend(client.process_ids.values())
    try:
        async def one(prompt: str) -> dict[str, object]:
            deltas = []
            async for out in client.generate(prompt, PARAMS):
                deltas.append(out.delta_text)
            return {"token_ids": out.token_ids, "deltas": deltas, "text": out.text}

        return await asyncio.gather(*(one(p) for p in PROMPTS))
    finally:
        if not forget:
            await client.shutdown()


async def main(result: dict[str, object], forgotten: list[int]) -> None:
    loop = asyncio.get_running_loop()
    handlers_before = dict(getattr(loop, "_signal_handlers", {}))
    pids: list[int] = []
    result["a"], result["b"] = await asyncio.gather(
        run(sys.argv[1], sys.argv[2], False, pids), run(sys.argv[3], sys.argv[4], True,
                                                         forgotten))
    result["torch"] = "torch" in sys.modules
    result["loop"] = type(loop).__module__
    result["signal_handlers_added"] = (len(getattr(loop, "_signal_handlers", {}))
                                       - len(handlers_before))
    result["shut_down_alive"] = [p for p in pids if psutil.pid_exists(p)]


if __name__ == "__main__":
    result: dict[str, object] = {}
    forgotten: list[int] = []
    uvloop.run(main(result, forgotten))
    gc.collect()  # the forgotten client is garbage now: its finalizer stops the engine
    result["forgotten_alive"] = [p for p in forgotten if psutil.pid_exists(p)]
    result["forgotten_pids"] = forgotten
    print(json.dumps(result))

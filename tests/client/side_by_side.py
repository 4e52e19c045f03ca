"""Run as a script by test_client_host.py, in a fresh interpreter: two clients on different
transports and detokenizer placements, side by side on one uvloop event loop. Prints JSON."""

from __future__ import annotations

import asyncio
import json
import sys

import uvloop

from aioengine import AsyncMPClient, EngineConfig, SamplingParams

PROMPTS = ["Once upon a time", "Il était une fois", "昔々、森に", "🦊 and 🌲"]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


async def run(transport: str, detokenize_in: str) -> list[dict[str, object]]:
    config = EngineConfig(model="tiny", transport=transport, detokenize_in=detokenize_in,
                          num_kv_blocks=128, max_model_len=256)
    async with AsyncMPClient(config) as client:
        async def one(prompt: str) -> dict[str, object]:
            deltas = []
            async for out in client.generate(prompt, PARAMS):
                deltas.append(out.delta_text)
            return {"token_ids": out.token_ids, "deltas": deltas, "text": out.text}

        return await asyncio.gather(*(one(p) for p in PROMPTS))


async def main() -> None:
    loop = asyncio.get_running_loop()
    handlers_before = dict(getattr(loop, "_signal_handlers", {}))
    a, b = await asyncio.gather(run(sys.argv[1], sys.argv[2]), run(sys.argv[3], sys.argv[4]))
    print(json.dumps({"a": a, "b": b, "torch": "torch" in sys.modules,
                      "loop": type(loop).__module__,
                      "signal_handlers_added": len(getattr(loop, "_signal_handlers", {}))
                      - len(handlers_before)}))


if __name__ == "__main__":
    uvloop.run(main())

"""The smallest complete embedding: an existing asyncio program streams from aioengine.

The engine runs in child processes; this program's event loop only holds the client, so it
keeps doing its own work (here, a heartbeat) while tokens stream in.

    python examples/embed_in_asyncio.py "Once upon a time"
"""

from __future__ import annotations

import asyncio
import sys

from aioengine import AsyncMPClient, EngineConfig, SamplingParams


async def heartbeat(period: float) -> None:
    """Stands for whatever else the host program does on its loop."""
    while True:
        await asyncio.sleep(period)
        print(" .", end="", file=sys.stderr, flush=True)


async def main(prompt: str) -> None:
    async with AsyncMPClient(EngineConfig(model="tiny")) as client:
        beat = asyncio.create_task(heartbeat(0.5))
        try:
            params = SamplingParams(max_tokens=32, temperature=0.8, seed=0)
            async for out in client.generate(prompt, params):
                print(out.delta_text, end="", flush=True)
            print(f"\n[{out.finish_reason}: {len(out.token_ids)} tokens]")
        finally:
            beat.cancel()


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "Once upon a time"))

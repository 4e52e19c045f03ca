"""aioengine embedded in a trio program: the same client as under asyncio, started from a trio
task (``trio.run``, or ``anyio.run(..., backend="trio")``).

The engine runs in child processes; the client picks trio's objects when it starts (its
background tasks are trio system tasks), so this program's own tasks (here, a heartbeat in a
nursery) keep running while tokens stream in.

    python examples/embed_in_trio.py "Once upon a time"
"""

from __future__ import annotations

import sys

import trio

from aioengine import AsyncMPClient, EngineConfig, SamplingParams


async def heartbeat(period: float) -> None:
    """Stands for whatever else the host program does on its loop."""
    while True:
        await trio.sleep(period)
        print(" .", end="", file=sys.stderr, flush=True)


async def main(prompt: str) -> None:
    async with AsyncMPClient(EngineConfig(model="tiny")) as client, trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat, 0.5)
        params = SamplingParams(max_tokens=32, temperature=0.8, seed=0)
        async for out in client.generate(prompt, params):
            print(out.delta_text, end="", flush=True)
        print(f"\n[{out.finish_reason}: {len(out.token_ids)} tokens on {client.backend}]")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main, " ".join(sys.argv[1:]) or "Once upon a time")

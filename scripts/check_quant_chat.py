"""Real-model chat check for the quantized paths: greedy answers of SmolLM2-135M-Instruct (GGUF)
with float weights (dequantized at load) and with each ``quantization`` given on the command
line, to a few prompts; prints the answers and how many equal the float model's.

    python scripts/check_quant_chat.py FILE.gguf [gguf gguf:int8 q8_0 q4_0 ...]
"""

from __future__ import annotations

import sys

from aioengine import EngineConfig, SamplingParams
from aioengine.client.llm import LLM

PROMPTS = ["What is the capital of France?", "What is 2 + 2?",
           "Name three primary colors.", "Translate 'good morning' to Spanish.",
           "Who wrote Romeo and Juliet?"]


def answers(path: str, quantization: str | None) -> list[str]:
    """``quantization`` ``MODE`` or ``MODE:int8`` (8-bit activations)."""
    mode, _, act = (quantization or "").partition(":")
    cfg = EngineConfig(model=path, quantization=mode or None, quant_activations=act or "int16",
                       max_model_len=512, seed=0)
    with LLM(cfg) as llm:
        outs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS],
                        SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False)
    return [o.text for o in outs]


def main() -> None:
    path, modes = sys.argv[1], sys.argv[2:] or ["gguf"]
    ref = answers(path, None)
    print("float:", *[repr(a) for a in ref], sep="\n  ")
    for mode in modes:
        got = answers(path, mode)
        same = sum(a == b for a, b in zip(got, ref, strict=True))
        print(f"{mode}: {same}/{len(ref)} equal to float", *[repr(a) for a in got], sep="\n  ")


if __name__ == "__main__":
    main()

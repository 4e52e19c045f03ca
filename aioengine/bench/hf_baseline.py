"""Hugging Face transformers ``generate`` on a workload, batched statically: the baseline of
the ``offline`` suite.

Requests go in input order, ``batch_size`` at a time, left-padded; each batch runs until its
longest request is done (``max_new_tokens`` = ``min_new_tokens`` = the batch's longest output,
so eos never stops it early), greedy. Only each request's own requested tokens count as useful:
the padding work is the cost of static batching.

Runs in a child interpreter (``python -m aioengine.bench.hf_baseline SPEC.json``) so the bench
host never imports torch and the model's memory goes back when it exits. It loads the model
directory with ``AutoModelForCausalLM.from_pretrained`` (presets, which have no weights: random
ones of the same shapes), on the device and dtype the engine picks for ``dtype="auto"``, with
as many torch threads as the engine's thread policy gives one rank (``num_threads``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from aioengine.bench.workload import Workload

MARK = "HF-BASELINE "


@dataclass(frozen=True)
class HFRun:
    seconds: float  # median wall time of the timed repeats
    useful_tokens: int  # each request's own requested output tokens (as generated)
    generated_tokens: int  # every row of every batch, padding included
    repeats: list[float]


def run_hf_baseline(model: str, workload: Workload, batch_size: int, repeats: int,
                    threads: int | None, spec_path: str, timeout: float) -> HFRun:
    """Run the child on ``workload`` (written to ``spec_path``) and return what it measured."""
    with open(spec_path, "w") as f:
        json.dump({"model": model, "prompts": workload.prompts,
                   "output_lens": workload.output_lens, "batch_size": batch_size,
                   "repeats": repeats, "threads": threads}, f)
    proc = subprocess.run([sys.executable, "-m", "aioengine.bench.hf_baseline", spec_path],
                          capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the transformers baseline failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return HFRun(**json.loads(lines[-1][len(MARK):]))


# ---- the child: everything below runs with torch imported -----------------------------------

def _load(model: str, threads: int | None) -> Any:
    from transformers import AutoConfig

    from aioengine.bench.hf_load import hf_model
    from aioengine.config import EngineConfig
    from aioengine.hub import resolve_model
    from aioengine.worker.loader.devices import resolve_device, resolve_dtype
    from aioengine.worker.threads import apply_thread_policy

    apply_thread_policy(EngineConfig(model=model, num_threads=threads), 1)

    resolved = resolve_model(model)
    hf_config = AutoConfig.from_pretrained(resolved.model_path)
    device = resolve_device("auto")
    dtype = resolve_dtype("auto", hf_config, device)
    return hf_model(resolved, dtype).to(device).eval()


def _pad_id(model: Any) -> int:
    for source in (model.generation_config, model.config):
        pad = getattr(source, "pad_token_id", None)
        if isinstance(pad, int):
            return pad
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            return eos
        if isinstance(eos, list) and eos:
            return eos[0]
    return 0


def _generate(model: Any, prompts: list[list[int]], new_tokens: int, pad: int) -> int:
    """One static batch; returns the number of new tokens every row got."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=pad)
    return int(out.shape[1]) - width


def _measure(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    model = _load(spec["model"], spec["threads"])
    pad = _pad_id(model)
    prompts, outs, bs = spec["prompts"], spec["output_lens"], spec["batch_size"]
    batches = [(prompts[i:i + bs], outs[i:i + bs]) for i in range(0, len(prompts), bs)]
    with torch.inference_mode():
        _generate(model, batches[0][0], 4, pad)  # warm-up (not timed)
        times, useful, generated = [], 0, 0
        for _ in range(spec["repeats"]):
            useful = generated = 0
            t0 = time.perf_counter()
            for p, o in batches:
                got = _generate(model, p, max(o), pad)
                useful += sum(min(n, got) for n in o)  # counted, not assumed
                generated += got * len(p)
            times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "useful_tokens": useful,
            "generated_tokens": generated, "repeats": times}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        result = _measure(json.load(f))
    print(MARK + json.dumps(result), flush=True)

"""KV cache sizing and allocation."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from transformers import LlamaConfig

from aioengine.config import EngineConfig
from aioengine.worker.kv_cache import (
    allocate_kv_cache,
    kv_cache_bytes_per_block,
    kv_cache_dtype,
    num_blocks_for_bytes,
)

CONFIG = LlamaConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
                     num_hidden_layers=3, intermediate_size=96, vocab_size=100,
                     architectures=["LlamaForCausalLM"])


def test_bytes_per_block():
    # 2 (k, v) * 3 layers * 16 tokens * 4 kv heads * 8 head_dim * 2 bytes
    assert kv_cache_bytes_per_block(CONFIG, 16, torch.bfloat16) == 2 * 3 * 16 * 4 * 8 * 2
    assert kv_cache_bytes_per_block(CONFIG, 16, torch.float32, tp_size=2) == 2 * 3 * 16 * 2 * 8 * 4


def test_allocate_shapes_and_zeroed():
    caches = allocate_kv_cache(CONFIG, 10, 16, torch.float32, "cpu", tp_size=2)
    assert len(caches) == 3
    assert all(c.shape == (2, 2, 10, 16, 8) and not c.any() for c in caches)
    per = kv_cache_bytes_per_block(CONFIG, 16, torch.float32, tp_size=2)
    assert sum(c.numel() * c.element_size() for c in caches) == 10 * per


def test_num_blocks_for_bytes():
    per = kv_cache_bytes_per_block(CONFIG, 16, torch.float32)
    assert num_blocks_for_bytes(CONFIG, 5 * per + 1, 16, torch.float32) == 5
    with pytest.raises(ValueError, match="holds no block"):
        num_blocks_for_bytes(CONFIG, per - 1, 16, torch.float32)


def test_bad_sizes():
    with pytest.raises(ValueError, match="must be positive"):
        allocate_kv_cache(CONFIG, 0, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"num_key_value_heads \(4\) must be divisible"):
        kv_cache_bytes_per_block(CONFIG, 16, torch.float32, tp_size=3)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


MiB = 1 << 20


def test_cpu_cache_is_resident_at_allocation_and_freed_with_it():
    """256 MiB of cache is resident once allocated (written at start: serving does not grow
    the process; issue 40), reads zero, and goes back to the kernel when freed."""
    config = LlamaConfig(hidden_size=256, num_attention_heads=8, num_key_value_heads=8,
                         num_hidden_layers=4, intermediate_size=96, vocab_size=100,
                         architectures=["LlamaForCausalLM"])
    per = kv_cache_bytes_per_block(config, 16, torch.float32)
    blocks = (256 * MiB) // per
    gc.collect()
    before = _rss_bytes()
    caches = allocate_kv_cache(config, blocks, 16, torch.float32, "cpu")
    assert sum(c.numel() * c.element_size() for c in caches) == blocks * per >= 250 * MiB
    allocated = _rss_bytes()
    assert allocated - before >= 250 * MiB  # every page committed now, not on first use
    assert all(not c.any() for c in caches)
    for c in caches:
        c[:, :, : blocks // 2] = 1.5
    # Writing half the cache adds nothing (a lazy cache would grow by ~128 MiB here); the
    # slack is for what the write itself may start (torch's thread pool, its stacks).
    written = _rss_bytes()
    assert written - allocated < 64 * MiB
    del caches, c
    gc.collect()
    # Freed: the process shrinks by the cache's size. Measured as the drop, not against the
    # start: what the write started (threads, their arenas) stays, and is not the cache.
    assert written - _rss_bytes() >= 240 * MiB


def _locked_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmLck:"))
    return int(line.split()[1]) * 1024


def test_cpu_cache_lock_locks_its_pages():
    per = kv_cache_bytes_per_block(CONFIG, 16, torch.float32)
    before = _locked_bytes()
    caches = allocate_kv_cache(CONFIG, (2 * MiB) // per, 16, torch.float32, "cpu", lock=True)
    nbytes = sum(c.numel() * c.element_size() for c in caches)
    assert _locked_bytes() - before >= nbytes - 4096 * len(caches)
    assert all(not c.any() for c in caches)
    del caches
    gc.collect()
    assert _locked_bytes() - before < MiB  # munlocked with the mapping


@pytest.mark.skipif(os.geteuid() == 0, reason="root (CAP_IPC_LOCK) is not held to the limit")
def test_cpu_cache_lock_over_the_limit_says_so():
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no memlock limit")
    per = kv_cache_bytes_per_block(CONFIG, 16, torch.float32)
    with pytest.raises(OSError, match=r"kv_cache_lock: mlock .* the memlock limit is"):
        allocate_kv_cache(CONFIG, 2 * soft // per + 1, 16, torch.float32, "cpu", lock=True)


def test_cpu_cache_in_every_dtype():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        caches = allocate_kv_cache(CONFIG, 3, 4, dtype, "cpu")
        assert all(c.dtype == dtype and c.shape == (2, 4, 3, 4, 8) and c.is_contiguous()
                   and not c.any() for c in caches)
        caches[0][1, 2, 1] = 2.0
        assert float(caches[0].sum()) == 2.0 * 4 * 8 and not caches[1].any()


def test_kv_cache_dtype_resolution():
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    # auto: float16 only for a float32 model on CPU whose decodes use the compiled kernel
    assert kv_cache_dtype("auto", f32, "cpu", True) == f16
    assert kv_cache_dtype("auto", f32, "cpu", False) == f32
    assert kv_cache_dtype("auto", bf16, "cpu", True) == bf16
    assert kv_cache_dtype("auto", bf16, "cuda", False) == bf16
    assert kv_cache_dtype("auto", f32, "cuda", False) == f32
    assert kv_cache_dtype("model", f32, "cpu", True) == f32
    assert kv_cache_dtype("float32", f32, "cpu", True) == f32
    assert kv_cache_dtype("float16", f32, "cpu", False) == f16
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of .*got 'int8'"):
        kv_cache_dtype("int8", f32, "cpu", True)
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of .*got 'fp8'"):
        EngineConfig(model="x", kv_cache_dtype="fp8")


def test_float16_cache_halves_the_bytes_per_block():
    assert kv_cache_bytes_per_block(CONFIG, 16, torch.float16) * 2 == \
        kv_cache_bytes_per_block(CONFIG, 16, torch.float32)

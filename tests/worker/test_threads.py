"""The compiled kernels' thread count: measured at load when ``num_threads`` is unset (once per
model and machine, then read from the cache), ``num_threads`` winning, bad counts refused."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from aioengine.config import EngineConfig, cache_dir
from aioengine.worker import gemv, threads
from aioengine.worker.model_runner import ModelRunner


@pytest.fixture(autouse=True)
def _restore_counts():
    old_torch, old_gemv = torch.get_num_threads(), gemv.threads()
    yield
    threads.set_kernel_threads(None)
    torch.set_num_threads(old_torch)
    gemv.set_threads(old_gemv)


def _busy(seconds_by_count: dict[int, float]):
    """A real workload whose time per call depends on the count (spins, no sleeping)."""
    calls: list[int] = []

    def run(n: int) -> None:
        calls.append(n)
        end = time.perf_counter() + seconds_by_count[n]
        while time.perf_counter() < end:
            pass

    return run, calls


def test_the_fastest_count_must_beat_every_smaller_one_by_five_percent() -> None:
    assert threads.pick_count({1: 4.0, 2: 2.0, 3: 1.95}) == 2  # 3 is faster, not by 5%
    assert threads.pick_count({1: 2.0, 2: 2.1}) == 1
    assert threads.pick_count({1: 2.0, 2: 1.0, 3: 1.5, 4: 0.5}) == 4
    run, calls = _busy({1: 0.03, 2: 0.002})
    n, times = threads.fastest_count(run, 2, reps=3)
    assert calls == [1, 2] * 4 and set(times) == {1, 2}  # a warm-up each, then in turns
    assert times[1] > 0.03 and n == threads.pick_count(times) == 2


@pytest.mark.parametrize("bad", [0, -1, 257, True, 2.0, "2"])
def test_bad_counts_are_refused(bad) -> None:
    with pytest.raises(ValueError, match=r"the kernels' thread count must be an int in 1\.\.256"):
        threads.set_kernel_threads(bad)
    with pytest.raises(ValueError, match=r"the thread budget must be an int in 1\.\.256"):
        threads.fastest_count(lambda n: None, bad)


@pytest.fixture
def quiet(monkeypatch) -> None:
    """Cache every measurement whatever the load of this shared machine (``BUSY_LOAD``)."""
    monkeypatch.setattr(threads, "BUSY_LOAD", float("inf"))


def test_a_count_measured_on_a_busy_machine_is_not_kept(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AIOENGINE_CACHE", str(tmp_path))
    monkeypatch.setattr(threads, "BUSY_LOAD", 0.0)  # any load is busy
    run, calls = _busy({1: 0.001, 2: 0.02})
    assert threads.cached_fastest_count({"model": "m"}, 2, run) == (1, True)
    assert threads.cached_fastest_count({"model": "m"}, 2, run) == (1, True)
    assert len(calls) == 24 and not (tmp_path / "threads").exists()


def test_the_count_is_measured_once_and_read_back(tmp_path: Path, monkeypatch, quiet) -> None:
    monkeypatch.setenv("AIOENGINE_CACHE", str(tmp_path))
    run, calls = _busy({1: 0.02, 2: 0.001})
    key = {"model": "m.gguf", "layout": "x8"}
    assert threads.cached_fastest_count(key, 2, run) == (2, True)
    measured = len(calls)
    path = threads.threads_cache_path({**key, **threads.machine_key(), "budget": 2,
                                       "version": threads.CACHE_VERSION})
    record = json.loads(path.read_text())
    assert record["threads"] == 2 and set(record["median_ms"]) == {"1", "2"}
    assert record["key"]["model"] == "m.gguf" and record["key"]["cpus"] == threads.usable_cpus()
    assert threads.cached_fastest_count(key, 2, run) == (2, False) and len(calls) == measured
    # another model or budget is another measurement
    assert threads.cached_fastest_count({**key, "model": "n.gguf"}, 2, run)[1]
    assert threads.cached_fastest_count(key, 1, run) == (1, True)
    # a cached count that does not fit (or a broken file) is measured again and rewritten
    for broken in ('{"threads": 7}', '{"threads": 0}', '{"threads": "2"}', "not json", "{}"):
        path.write_text(broken)
        calls.clear()
        assert threads.cached_fastest_count(key, 2, run) == (2, True) and calls
        assert json.loads(path.read_text())["threads"] == 2


def _records(model_path: str) -> list[tuple[Path, dict]]:
    out = []
    for path in (Path(cache_dir()) / "threads").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("key", {}).get("model") == os.path.realpath(model_path):
            out.append((path, record))
    return out


def test_a_quantized_model_runs_on_the_measured_count_and_num_threads_wins(quiet) -> None:
    config = EngineConfig(model="tiny", device="cpu", dtype="float32", quantization="q8_0")
    runner = ModelRunner(config)
    n = threads.kernel_threads()
    assert 1 <= n <= threads.usable_cpus() and gemv.threads() == n
    q = next(m.qweight for m in runner.model.modules() if getattr(m, "qweight", None))
    mine = [(p, r) for p, r in _records(_model_path(config))
            if (r["key"]["kernel"], r["key"]["layout"], r["key"]["budget"],
                r["key"]["version"]) == (q.kernel.path, repr(q.policy), threads.usable_cpus(),
                                         threads.CACHE_VERSION)]
    assert [r["threads"] for _, r in mine] == [n], mine
    path, _ = mine[0]
    stamp = path.stat().st_mtime_ns
    warm = ModelRunner(config)  # a warm start reads it back
    assert threads.kernel_threads() == n and path.stat().st_mtime_ns == stamp
    assert not warm.kernel_threads_measured
    for explicit in (1, 2):
        runner = ModelRunner(EngineConfig(model="tiny", device="cpu", dtype="float32",
                                          quantization="q8_0", num_threads=explicit))
        assert threads.kernel_threads() == torch.get_num_threads() == explicit
        assert not runner.kernel_threads_measured


def _model_path(config: EngineConfig) -> str:
    from aioengine.hub import resolve_model

    return resolve_model(config.model, config.tokenizer).model_path

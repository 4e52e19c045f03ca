"""The Ray Serve entry point on the package's cluster: two Serve replicas behind Ray Serve's
prefix-aware router answer completions and chats; a SIGKILLed engine fails Serve's health check
and Serve replaces the replica; ``serve.shutdown()`` leaves no replica actor behind."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from aioengine import EngineConfig
from tests.ray.test_ray_replicas import assert_nothing_left

ray = pytest.importorskip("ray")


# Two replicas start, one is killed and Serve starts another: three engine start-ups beside
# Ray's own processes, each of which took over two minutes on a 2-core machine under two CPU hogs.
@pytest.mark.timeout(1200)
def test_serve_replicas_answer_and_a_dead_engine_is_replaced(cluster: Any) -> None:
    from ray import serve

    from aioengine.integrations.ray_serve import ChatRequest, CompletionRequest, deployment

    config = EngineConfig(model="tiny", num_kv_blocks=128, max_model_len=256,
                          startup_timeout=600.0)
    app = deployment(config, num_replicas=2, ray_actor_options={"num_cpus": 0.25},
                     health_check_period_s=1, health_check_timeout_s=60)
    try:
        handle = serve.run(app, name="aioengine-test", route_prefix=None)
        params = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
        replies = [handle.completions.remote(CompletionRequest("a shared prefix " * 8 + str(i),
                                                               params)).result(timeout_s=120)
                   for i in range(4)]
        assert all(len(r["token_ids"]) == 6 for r in replies)
        assert replies[-1]["num_cached_tokens"] > 0  # the prefix-aware router kept them together
        chat = handle.chat.remote(ChatRequest([{"role": "user", "content": "hi"}], params))
        assert len(chat.result(timeout_s=60)["token_ids"]) == 6

        pid = handle.engine_pid.remote().result(timeout_s=30)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 600  # a replica's engine start-up under load (see above)
        while time.monotonic() < deadline:  # Serve's health check fails; a new replica starts
            pids = {handle.engine_pid.remote().result(timeout_s=30) for _ in range(6)}
            if pid not in pids and len(pids) == 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the replica with the dead engine {pid} was not replaced")
        again = handle.completions.remote(CompletionRequest("after", params))
        assert len(again.result(timeout_s=120)["token_ids"]) == 6
    finally:
        serve.shutdown()
    assert_nothing_left([pid, *pids])


def test_deployment_checks_its_arguments() -> None:
    from aioengine.integrations.ray_serve import deployment

    with pytest.raises(ValueError, match="EngineConfig"):
        deployment({"model": "tiny"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_replicas, not data_parallel_size"):
        deployment(EngineConfig(data_parallel_size=2))


@pytest.mark.timeout(1200)  # two replicas' engines start beside Ray's processes (see above)
def test_the_ray_serve_example_runs_as_written(cluster: Any) -> None:
    import subprocess
    import sys

    from tests.server.server_process import ROOT

    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, os.path.join("examples", "ray_serve_app.py"),
                        "--address", cluster.address], cwd=ROOT, capture_output=True,
                       text=True, timeout=1100, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    # (Ray's own processes may log to stdout too: only the example's answers are checked.)
    lines = [line for line in r.stdout.splitlines() if line.startswith("'What is")]
    assert len(lines) == 3 and all("cached prompt tokens" in line for line in lines), r.stdout
    assert lines[-1].endswith(tuple(f"{n})" for n in range(16, 1000))), lines  # a prefix hit

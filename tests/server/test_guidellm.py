"""guidellm (0.8.1), the load generator for OpenAI-compatible servers, against a real
``python -m aioengine.serve``: a short synchronous and a short concurrent run, 0 errors.

guidellm streams with ``stream_options: {include_usage, continuous_usage_stats}`` (a vLLM
extension): before the server honoured it every request was a 400 and guidellm printed zeros.

guidellm lives in its own venv, cached in the test cache. It must not bring its own torch (a
multi-GB CUDA build): the venv sees this interpreter's packages through a ``.pth`` file, so
pip finds torch (2.13.0) installed and adds only what guidellm needs on top. Marked slow: the
first run installs (~45 s), each benchmark takes ~30-50 s on the 2-core box.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator

import pytest

from aioengine.hub import resolve_model
from tests.server.server_process import ServerProcess

pytestmark = pytest.mark.slow

GUIDELLM = "0.8.1"
CACHE = os.environ.get("AIOENGINE_TEST_CACHE", "/tmp/aioengine-test-cache")


def guidellm_venv() -> str:
    """The cached venv's ``guidellm`` executable, installing it on first use. Its ``.pth``
    names this run's packages every time: the cache outlives the venv that first wrote it (a
    CI clone's, since removed: guidellm then failed to import pydantic)."""
    venv = os.path.join(CACHE, f"guidellm-{GUIDELLM}")
    exe = os.path.join(venv, "bin", "guidellm")
    if not os.path.exists(exe):
        subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", venv], check=True)
    site = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "shared-packages.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")  # torch and the rest, shared
    if os.path.exists(exe):
        return exe
    result = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--quiet",
                             f"guidellm=={GUIDELLM}"], capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        pytest.fail(f"installing guidellm {GUIDELLM} failed:\n{result.stderr[-3000:]}")
    return exe


@pytest.fixture(scope="module")
def guidellm() -> str:
    return guidellm_venv()


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """One server for both runs (each run is its own set of requests)."""
    with ServerProcess() as server:
        yield server.url
        assert server.terminate() == 0, server.output()


@pytest.mark.parametrize("profile,count", [("kind=synchronous", 6),
                                           ("kind=concurrent,streams=4", 12)])
def test_guidellm_runs_with_no_errors(guidellm, server_url, tmp_path, profile, count):
    tokenizer = resolve_model("tiny").tokenizer_path
    out = tmp_path / "result.json"
    run = subprocess.run(
        [guidellm, "run", "--backend", f"kind=openai_http,target={server_url},model=tiny",
         "--tokenizer", f"kind=hf_auto,model={tokenizer}",
         "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=16",
         "--profile", profile, "--constraint", f"kind=max_requests,count={count}",
         "--output", f"kind=json,path={out}", "--disable-console"],
        capture_output=True, text=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    bench = json.loads(out.read_text())["benchmarks"][0]
    made = bench["scheduler_metrics"]["requests_made"]
    assert made["errored"] == 0 and made["incomplete"] == 0, made
    assert made["successful"] == count, made
    # Streamed usage reached guidellm: 16 output tokens a request.
    assert bench["metrics"]["output_token_count"]["successful"]["mean"] == 16.0

"""A user's script that starts an engine without ``if __name__ == "__main__":`` fails fast with
one clear message (children are spawned and import the main script again), and leaves nothing
running; the same script with the guard works. Real interpreters run real scripts."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = 'EngineConfig(model="tiny", device="cpu", max_model_len=128, num_kv_blocks=32)'
GUARD = 'if __name__ == "__main__":'

ASYNC_BODY = f"""
import asyncio
from aioengine import AsyncMPClient, EngineConfig, SamplingParams

async def main():
    async with AsyncMPClient({CONFIG}) as client:
        async for out in client.generate("x", SamplingParams(max_tokens=2)):
            pass
    print("done", out.finish_reason)
"""
LLM_BODY = """
from aioengine import LLM, EngineConfig, SamplingParams
"""
STARTS = {"async": (ASYNC_BODY, "asyncio.run(main())"),
          "llm": (LLM_BODY, f"llm = LLM({CONFIG})\n"
                            'out = llm.generate("x", SamplingParams(max_tokens=2))\n'
                            'print("done", out[0].finish_reason)\n'
                            "llm.shutdown()")}


def run_script(path: Path, timeout: float = 120.0) -> tuple[int, str, str]:
    """Run ``path``; returns (status, stdout, stderr), asserting that every process it started
    (looked for the whole time it runs) is gone after it exits."""
    return run_interpreter([str(path)], path, stdin_file=None, timeout=timeout)[:3]


def run_interpreter(args: list[str], path: Path, *, stdin_file: Path | None,
                    timeout: float) -> tuple[int, str, str, list[psutil.Process]]:
    """``python *args`` in ``path``'s directory (stdin from ``stdin_file``); the same checks as
    ``run_script``, and also returns every process it started."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stdin = subprocess.DEVNULL if stdin_file is None else stdin_file.open("rb")
    try:
        proc = subprocess.Popen([sys.executable, *args], cwd=path.parent, env=env, stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        if stdin_file is not None:
            stdin.close()  # type: ignore[union-attr]
    seen: dict[int, psutil.Process] = {}
    watched = psutil.Process(proc.pid)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error):
                seen.update((c.pid, c) for c in watched.children(recursive=True))
            time.sleep(0.02)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    _, alive = psutil.wait_procs(list(seen.values()), timeout=10)
    for p in alive:
        p.kill()
    assert not alive, f"processes left behind: {alive}\n{err}"
    return proc.returncode, out, err, list(seen.values())


@pytest.mark.parametrize("kind", sorted(STARTS))
def test_unguarded_script_fails_fast_with_one_clear_message(tmp_path, kind):
    body, start = STARTS[kind]
    script = tmp_path / f"unguarded_{kind}.py"
    script.write_text(textwrap.dedent(body) + start + "\n")
    status, out, err = run_script(script)
    assert status == 1, err
    assert "done" not in out
    # The child says it in one line and exits; the parent's error says it again.
    child_line = (f"{str(script)!r} started an engine while a child process imported it; "
                  f"put the code that starts the engine under {GUARD}")
    assert child_line in err.splitlines(), err
    assert err.count("Traceback") == 1, err  # the parent's own, not the child's
    assert "bootstrapping phase" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("aioengine.runtime.errors.EngineStartupError: child process "
                           "'aioengine-engine'"), err
    assert f"the main script {str(script)!r} starts an engine when it is imported" in last
    assert last.endswith(f"under {GUARD}"), last


@pytest.mark.parametrize("kind", sorted(STARTS))
def test_the_same_script_with_the_guard_works(tmp_path, kind):
    body, start = STARTS[kind]
    script = tmp_path / f"guarded_{kind}.py"
    script.write_text(textwrap.dedent(body) + GUARD + "\n" + textwrap.indent(start, "    ")
                      + "\n")
    status, out, err = run_script(script)
    assert status == 0, err
    assert out.split() == ["done", "length"] or out.split() == ["done", "stop"], out


def guarded_script(tmp_path: Path, kind: str) -> Path:
    body, start = STARTS[kind]
    script = tmp_path / f"guarded_{kind}.py"
    script.write_text(textwrap.dedent(body) + GUARD + "\n" + textwrap.indent(start, "    ")
                      + "\n")
    return script


STDIN_MESSAGE = (
    "aioengine.runtime.errors.EngineStartupError: cannot start the engine's processes: the "
    "main script was read from standard input ('<stdin>', e.g. `python - < script.py`), and "
    "every child process must run it again (processes are started with 'spawn'): save it to a "
    f"file and run `python file.py` (engine started under {GUARD}), or pass it with `python -c`")


@pytest.mark.parametrize("flags", [("-",), ()], ids=["python-dash", "python-stdin"])
@pytest.mark.parametrize("kind", sorted(STARTS))
def test_a_script_on_stdin_fails_at_once_without_starting_a_process(tmp_path, kind, flags):
    # spawn would make each child run a file named '<stdin>' (there is none): it died before
    # READY with multiprocessing's FileNotFoundError traceback and 'exit code 1'.
    script = guarded_script(tmp_path, kind)
    status, out, err, started = run_interpreter(list(flags), script, stdin_file=script,
                                                timeout=120.0)
    assert status == 1, err
    assert "done" not in out
    assert not started, f"processes were started: {started}\n{err}"
    assert err.count("Traceback") == 1, err  # the host's own, no child's
    assert err.strip().splitlines()[-1] == STDIN_MESSAGE, err


def test_the_interactive_interpreter_fed_on_stdin_works(tmp_path):
    # `python -i` (and a terminal REPL) leave __main__.__file__ unset: children skip __main__.
    script = guarded_script(tmp_path, "llm")
    status, out, err, started = run_interpreter(["-i"], script, stdin_file=script,
                                                timeout=120.0)
    assert status == 0, err
    assert "done length" in out or "done stop" in out, out
    assert started, "the engine was not started"
    assert "Traceback" not in err, err


def test_the_same_code_with_python_c_works(tmp_path):
    script = guarded_script(tmp_path, "async")
    status, out, err, _ = run_interpreter(["-c", script.read_text()], script, stdin_file=None,
                                          timeout=120.0)
    assert status == 0, err
    assert out.split() in (["done", "length"], ["done", "stop"]), out


def test_a_main_script_deleted_while_it_runs_fails_at_once(tmp_path):
    body, start = STARTS["llm"]
    script = tmp_path / "vanishing.py"
    script.write_text(textwrap.dedent(body) + GUARD + "\n    import os\n    os.remove(__file__)\n"
                      + textwrap.indent(start, "    ") + "\n")
    status, _, err, started = run_interpreter([str(script)], script, stdin_file=None,
                                              timeout=120.0)
    assert status == 1, err
    assert not started, f"processes were started: {started}\n{err}"
    assert err.strip().splitlines()[-1] == (
        "aioengine.runtime.errors.EngineStartupError: cannot start the engine's processes: "
        f"the main script {str(script)!r} is not a file any more, and every child process must "
        "run it again (processes are started with 'spawn'): run the program from a file that "
        "exists while it runs"), err

"""Ctrl-C at any moment of ``python -m aioengine.bench`` ends it with status 130 and its last
line saying so (and nothing else), never a ``KeyboardInterrupt`` traceback, and leaves no
process behind: while a
suite starts its engine (the engine, bootstrapping, gets the SIGINT too), and mid-run (the
suite's engines are shut down as ``KeyboardInterrupt`` unwinds it). (Its imports take some tens
of milliseconds, too few to aim at; serve's test covers that handler.)"""

from __future__ import annotations

import sys

import pytest

from tests.interrupting import interrupt_program

CMD = [sys.executable, "-m", "aioengine.bench", "offline", "--quick", "--no-progress"]
LINE = "python -m aioengine.bench: interrupted (SIGINT)"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("when", ["child", 3.0])
def test_ctrl_c_ends_the_bench_with_one_line_and_status_130(when):
    run = interrupt_program(CMD, when)
    run.assert_no_traceback()
    assert run.status == 130, run.lines
    # Only that line: the engine got the SIGINT too but leaves stopping to the bench (it used
    # to stop at once, and the client logged 'engine is dead' while the bench unwound).
    assert run.lines == [LINE], run.lines

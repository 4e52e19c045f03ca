"""A sandbox that forbids SCHED_BATCH or thread affinity (a seccomp filter, as containers use)
costs the engine nothing: its I/O threads keep the default policy or run anywhere, say so at
debug level, and the engine starts and answers. The filter is real: a small launcher installs it
and execs Python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# argv[1] "batch": sched_setscheduler(_, SCHED_BATCH, _) fails with errno argv[2];
# "affinity": every sched_setaffinity does. Everything else is allowed.
LAUNCHER = r"""
#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    unsigned deny = SECCOMP_RET_ERRNO | (atoi(argv[2]) & SECCOMP_RET_DATA);
    struct sock_filter batch[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_sched_setscheduler, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SCHED_BATCH, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, deny),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_filter affinity[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_sched_setaffinity, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, deny),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof(batch) / sizeof(batch[0]), batch};
    if (strcmp(argv[1], "affinity") == 0)
        prog = (struct sock_fprog){sizeof(affinity) / sizeof(affinity[0]), affinity};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        return 1;
    }
    execv(argv[3], argv + 3);
    perror("execv");
    return 1;
}
"""

SCRIPT = """
import logging, os, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s: %(message)s")
from aioengine import LLM, EngineConfig, SamplingParams
if __name__ == "__main__":
    try:
        if sys.argv[1] == "batch":
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        else:
            os.sched_setaffinity(0, os.sched_getaffinity(0))
        sys.exit(f"the filter did not deny {sys.argv[1]}")
    except OSError:
        pass
    config = EngineConfig(model="tiny", transport=sys.argv[2], max_model_len=256,
                          num_kv_blocks=64)
    with LLM(config) as llm:
        out = llm.generate(["hi"], SamplingParams(max_tokens=4, ignore_eos=True),
                           use_tqdm=False)
    print(len(out[0].token_ids))
"""


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = os.environ.get("AIOENGINE_CC") or shutil.which("cc")
    if not sys.platform.startswith("linux") or cc is None:
        pytest.skip("needs Linux and a C compiler")
    d = tmp_path_factory.mktemp("seccomp")
    (d / "deny.c").write_text(LAUNCHER)
    subprocess.run([cc, "-O2", "-o", str(d / "deny"), str(d / "deny.c")],
                   check=True, capture_output=True)
    return str(d / "deny")


def _run(launcher: str, tmp_path, mode: str, errno_: int, transport: str) -> str:
    """Generate 4 tokens under the filter; the run's stderr (debug logging)."""
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    r = subprocess.run([launcher, mode, str(errno_), sys.executable, str(script), mode,
                        transport], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "4", (r.stdout, r.stderr)
    return r.stderr


@pytest.mark.parametrize(("errno_", "transport"), [(1, "zmq"), (38, "shm")])  # EPERM, ENOSYS
def test_engine_starts_where_sched_batch_is_denied(launcher, tmp_path, errno_, transport):
    stderr = _run(launcher, tmp_path, "batch", errno_, transport)
    denied = [line for line in stderr.splitlines() if "SCHED_BATCH not available" in line]
    assert len(denied) == 2, stderr  # engine-input and engine-output, at debug level


@pytest.mark.parametrize(("errno_", "transport"), [(1, "uds"), (38, "shm")])  # EPERM, ENOSYS
def test_engine_runs_where_thread_affinity_is_denied(launcher, tmp_path, errno_, transport):
    """The I/O threads cannot follow the model's CPU: the engine says so once and carries on
    with them wherever the OS puts them."""
    stderr = _run(launcher, tmp_path, "affinity", errno_, transport)
    denied = [line for line in stderr.splitlines() if "cannot follow the model's CPU" in line]
    assert len(denied) == 1, stderr

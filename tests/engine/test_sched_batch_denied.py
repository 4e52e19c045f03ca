"""A sandbox that forbids SCHED_BATCH (a seccomp filter, as containers use) costs the engine
nothing: its I/O threads keep the default policy, say so at debug level, and the engine starts
and answers. The filter is real: a small launcher installs it and execs Python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# sched_setscheduler(_, SCHED_BATCH, _) fails with errno argv[1]; everything else is allowed.
LAUNCHER = r"""
#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_sched_setscheduler, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SCHED_BATCH, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (atoi(argv[1]) & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof(f) / sizeof(f[0]), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        return 1;
    }
    execv(argv[2], argv + 2);
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
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        sys.exit("the filter did not deny SCHED_BATCH")
    except OSError:
        pass
    config = EngineConfig(model="tiny", transport=sys.argv[1], max_model_len=256,
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
    (d / "deny_batch.c").write_text(LAUNCHER)
    subprocess.run([cc, "-O2", "-o", str(d / "deny_batch"), str(d / "deny_batch.c")],
                   check=True, capture_output=True)
    return str(d / "deny_batch")


@pytest.mark.parametrize(("errno_", "transport"), [(1, "zmq"), (38, "shm")])  # EPERM, ENOSYS
def test_engine_starts_where_sched_batch_is_denied(launcher, tmp_path, errno_, transport):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    r = subprocess.run([launcher, str(errno_), sys.executable, str(script), transport],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "4", (r.stdout, r.stderr)
    denied = [line for line in r.stderr.splitlines() if "SCHED_BATCH not available" in line]
    assert len(denied) == 2, r.stderr  # engine-input and engine-output, at debug level

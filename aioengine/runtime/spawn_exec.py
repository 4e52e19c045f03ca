"""Spawn a child with its environment handed to ``exec``, never read from the shared ``environ``.

multiprocessing's spawn execs the new interpreter with the process-wide C ``environ`` (it takes
no env of its own) and never reads its exec-error pipe. Any thread of the host that sets a
variable meanwhile (numpy's import does: ``OPENBLAS_MAIN_FREE``) can hand ``execve`` an array
that glibc has just reallocated and freed; the exec then fails and the child leaves with exit
code 255 and no word. With a thread churning the environment, about a third of plain spawns died
that way. Here the environment is copied into Python first and passed to ``subprocess.Popen``,
which builds the child's own array before it forks and raises the exec error in the parent.

The rest is multiprocessing's spawn unchanged (``popen_spawn_posix``): the same command line,
preparation data, pipes and resource tracker, so the child runs ``spawn_main`` as ever.
"""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Mapping
from multiprocessing import popen_spawn_posix, reduction, resource_tracker, spawn, util
from multiprocessing.context import SpawnProcess, set_spawning_popen
from typing import Any


class ExplicitEnvProcess(SpawnProcess):
    """A spawn ``Process`` whose child starts with ``os.environ`` plus ``child_env``."""

    def __init__(self, *args: Any, child_env: Mapping[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.child_env = dict(child_env or {})

    @staticmethod
    def _Popen(process_obj: Any) -> ExplicitEnvPopen:
        return ExplicitEnvPopen(process_obj)


class ExplicitEnvPopen(popen_spawn_posix.Popen):
    _fds: list[int]  # set by popen_spawn_posix.Popen: the fds the child inherits
    _exec: subprocess.Popen[bytes] | None = None

    def _launch(self, process_obj: Any) -> None:
        env = {**os.environ, **getattr(process_obj, "child_env", {})}  # one consistent copy
        tracker_fd = resource_tracker.getfd()  # starts the tracker if it is not running
        if tracker_fd is None:
            raise RuntimeError("multiprocessing's resource tracker did not start")
        self._fds.append(tracker_fd)
        prep_data = spawn.get_preparation_data(process_obj._name)
        fp = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            # restore_signals=False and the caller's signal mask, as multiprocessing's spawn.
            self._exec = subprocess.Popen(cmd, executable=spawn.get_executable(), env=env,
                                          pass_fds=self._fds, close_fds=True,
                                          restore_signals=False)
            self.pid = self._exec.pid
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            self.finalizer = util.Finalize(
                self, _close_fds, ([fd for fd in (parent_r, parent_w) if fd is not None],))
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        code = super().poll(flag)
        if code is not None and self._exec is not None:
            # multiprocessing reaped the child; subprocess must not wait later on a pid that
            # the system may since have given to another process.
            self._exec.returncode = code
        return code


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)

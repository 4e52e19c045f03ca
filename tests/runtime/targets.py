"""Tiny busy-loop targets for the runtime tests (spawn imports them by name from here).

Factories take msgpack bytes: a dict with optional ``marker`` (a file cleanup writes, proving it
ran), ``payload`` (extra READY payload) and target-specific keys.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from typing import Any

import msgspec

from aioengine.runtime import BusyLoopTarget, ChildSpec, LoopContext, Supervisor


def expected_process_name(title: str) -> str:
    """What psutil reports for a child titled ``title``: the whole title when setproctitle is
    installed (it rewrites the command line), else the kernel's 15-byte name."""
    return title if importlib.util.find_spec("setproctitle") else title[:15]


def encode_args(**kwargs: Any) -> bytes:
    return msgspec.msgpack.encode(kwargs)


def _args(raw: bytes) -> dict[str, Any]:
    return msgspec.msgpack.decode(raw) if raw else {}


def _write_marker(path: str | None, text: str) -> None:
    if path:
        with open(path, "w") as f:
            f.write(text)


class Idle(BusyLoopTarget):
    """Waits on the shutdown signal in short slices; cleanup writes the marker."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.args = args

    def init(self, ctx: LoopContext) -> dict[str, Any]:
        env = {k: os.environ.get(k) for k in self.args.get("env_names", [])}
        return {"pid": os.getpid(), **self.args.get("payload", {}), **({"env": env} if env else {})}

    def step(self, ctx: LoopContext) -> None:
        ctx.wait(0.05)

    def cleanup(self) -> None:
        _write_marker(self.args.get("marker"), f"cleaned {os.getpid()}")


def idle(raw: bytes) -> Idle:
    return Idle(_args(raw))


class BlockedRecv(Idle):
    """Its step blocks in ``recv`` with no timeout; a wake-up callback breaks the wait."""

    def init(self, ctx: LoopContext) -> dict[str, Any]:
        self.sock, self.peer = socket.socketpair()
        ctx.add_wakeup(lambda: self.sock.shutdown(socket.SHUT_RDWR))
        return super().init(ctx)

    def step(self, ctx: LoopContext) -> None:
        self.sock.recv(1)  # returns b"" once the wake-up shut the socket down

    def cleanup(self) -> None:
        self.sock.close()
        self.peer.close()
        super().cleanup()


def blocked_recv(raw: bytes) -> BlockedRecv:
    return BlockedRecv(_args(raw))


class FailingInit(Idle):
    def init(self, ctx: LoopContext) -> dict[str, Any]:
        raise ValueError("boom")


def failing_init(raw: bytes) -> FailingInit:
    return FailingInit(_args(raw))


class FailingStep(Idle):
    def step(self, ctx: LoopContext) -> None:
        ctx.wait(0.2)
        raise RuntimeError("step exploded")


def failing_step(raw: bytes) -> FailingStep:
    return FailingStep(_args(raw))


class ExitInInit(Idle):
    def init(self, ctx: LoopContext) -> dict[str, Any]:
        os._exit(3)


def exit_in_init(raw: bytes) -> ExitInInit:
    return ExitInInit(_args(raw))


class SlowInit(Idle):
    def init(self, ctx: LoopContext) -> dict[str, Any]:
        ctx.wait(60)  # returns early on SIGTERM
        return super().init(ctx)


def slow_init(raw: bytes) -> SlowInit:
    return SlowInit(_args(raw))


def busy_factory(raw: bytes) -> Idle:
    """Builds for a minute without looking at the shutdown flag (as an import or a model load
    does), then would be an ``Idle``. Writes the ``started`` file (if given) as it begins."""
    args = _args(raw)
    _busy(60, args.get("started"))
    return Idle(args)


class BusyInit(Idle):
    """``init`` works for a minute without looking at the shutdown flag. Writes the
    ``started`` file (if given) as it begins."""

    def init(self, ctx: LoopContext) -> dict[str, Any]:
        _busy(60, self.args.get("started"))
        return super().init(ctx)


def busy_init(raw: bytes) -> BusyInit:
    return BusyInit(_args(raw))


def _busy(seconds: float, started: str | None = None) -> None:
    _write_marker(started, f"started {os.getpid()}")  # a test waits for this, not for a time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(10_000))


class BadPayload(Idle):
    def init(self, ctx: LoopContext) -> Any:
        return self.args["payload"] if "payload" in self.args else {"obj": object()}


def bad_payload(raw: bytes) -> BadPayload:
    return BadPayload(_args(raw))


def not_a_target(raw: bytes) -> int:
    return 42


class StuckCleanup(Idle):
    """Its cleanup starts (writes the marker) and then hangs."""

    def cleanup(self) -> None:
        super().cleanup()
        time.sleep(60)


def stuck_cleanup(raw: bytes) -> StuckCleanup:
    return StuckCleanup(_args(raw))


class Stubborn(Idle):
    """Starts a grandchild, then its step never returns: only SIGKILL stops it."""

    def init(self, ctx: LoopContext) -> dict[str, Any]:
        self.sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        return {"pid": os.getpid(), "grandchild": self.sleeper.pid}

    def step(self, ctx: LoopContext) -> None:
        while True:
            time.sleep(0.05)


def stubborn(raw: bytes) -> Stubborn:
    return Stubborn(_args(raw))


class Middle(Idle):
    """Supervises its own children (as the engine supervises workers)."""

    def init(self, ctx: LoopContext) -> dict[str, Any]:
        self.supervisor = Supervisor(lambda name, code: ctx.request_shutdown(f"{name} died"))
        leaf = self.args.get("leaf_target", "tests.runtime.targets:idle")
        specs = [ChildSpec(f"aioengine-test-leaf{i}", leaf,
                           encode_args(marker=marker))
                 for i, marker in enumerate(self.args["leaf_markers"])]
        ready = self.supervisor.start(specs, timeout=60)
        return {"pid": os.getpid(), "leaves": [p["pid"] for p in ready.values()],
                "grace": self.supervisor.shutdown_grace}

    def cleanup(self) -> None:
        if hasattr(self, "supervisor"):
            self.supervisor.shutdown()
        super().cleanup()


def middle(raw: bytes) -> Middle:
    return Middle(_args(raw))

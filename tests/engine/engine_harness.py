"""Drives a real engine process over a real transport, as the client does: bind a request
writer and an output reader, spawn ``core_proc``'s target under a Supervisor, exchange
msgpack frames with typed decoders."""

from __future__ import annotations

import threading
import time

import msgspec
import psutil

from aioengine.config import EngineConfig
from aioengine.messages import (
    AbortRequests,
    AddRequest,
    ClientMessage,
    EngineFailure,
    EngineMessage,
    StepOutputs,
    UtilityCall,
    UtilityResult,
)
from aioengine.messages.launch import ENGINE_TARGET as TARGET
from aioengine.messages.launch import EngineLaunch
from aioengine.runtime import ChildSpec, Supervisor
from transports import open_reader, open_writer

from .workload import Output

NAME = "aioengine-engine"
TIMEOUT = 120.0  # generous: a loaded 2-core box


class EngineHarness:
    def __init__(self, config: EngineConfig, transport: str = "shm") -> None:
        self.requests = open_writer(transport, bind=True)
        self.outputs = open_reader(transport, bind=True)
        self.deaths: list[tuple[str, int | None]] = []
        self.died = threading.Event()
        # A generous grace: tests check a clean exit (code 0), which a loaded box may take
        # seconds to reach; the wait ends when the engine does.
        self.sup = Supervisor(self._on_death, shutdown_grace=60.0)
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(EngineMessage)
        self._call_id = 0
        self.failures: list[EngineFailure] = []
        self.others: dict[str, Output] = {}  # deltas for requests not passed to ``run``
        launch = EngineLaunch(config.to_msgpack(), self.requests.address, self.outputs.address)
        try:
            self.ready = self.sup.start([ChildSpec(NAME, TARGET, launch.encode())],
                                        config.startup_timeout)[NAME]
        except BaseException:
            self.close()
            raise

    def _on_death(self, name: str, exitcode: int | None) -> None:
        self.deaths.append((name, exitcode))
        self.died.set()

    @property
    def pid(self) -> int:
        return self.sup.pid(NAME)

    def workers(self) -> list[psutil.Process]:
        return sorted((p for p in psutil.Process(self.pid).children()
                       if p.name().startswith("aioengine-worke")), key=lambda p: p.pid)

    def send(self, msg: ClientMessage | bytes) -> None:
        self.requests.send(msg if isinstance(msg, bytes) else self._enc.encode(msg),
                           timeout=TIMEOUT)

    def recv(self, timeout: float = TIMEOUT) -> EngineMessage:
        msg = self._dec.decode(self.outputs.recv(timeout=timeout).header)
        if isinstance(msg, EngineFailure):
            self.failures.append(msg)
        return msg

    def call(self, method: str, *args: object) -> UtilityResult:
        self._call_id += 1
        self.send(UtilityCall(self._call_id, method, list(args)))
        while True:
            msg = self.recv()
            if isinstance(msg, UtilityResult):
                assert msg.call_id == self._call_id
                return msg

    def run(self, requests: list[AddRequest], abort: list[str] = ()) -> dict[str, Output]:
        """Send everything, then collect until every request has finished."""
        outs = {r.request_id: Output() for r in requests}
        for r in requests:
            self.send(r)
        if abort:
            self.send(AbortRequests(list(abort)))
        deadline = time.monotonic() + 600
        while any(o.finish_reason is None for o in outs.values()):
            assert time.monotonic() < deadline, "requests did not finish"
            msg = self.recv()
            if isinstance(msg, StepOutputs):
                for d in msg.outputs:
                    (outs.get(d.request_id) or self.others.setdefault(d.request_id,
                                                                      Output())).add(d)
            elif isinstance(msg, EngineFailure):
                break
        return outs

    def close(self) -> None:
        """As the client does: close our channels (the engine leaves on its own), then stop."""
        self.requests.close()
        self.outputs.close()
        self.sup.shutdown()

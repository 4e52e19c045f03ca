"""The Ray actor that holds one replica on whatever node Ray placed it: it spawns today's
process tree there (the engine, which spawns its TP workers) with our own ``Supervisor``, and
reports the engine's READY and, later, its death. The traffic never goes through Ray: the
engine connects to the channels the host bound (``zmq+tcp://`` from another node).

This module does not import ray: ``ray_replicas`` wraps the class with ``ray.remote``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import msgspec

from aioengine.client.launch import ENGINE_NAME
from aioengine.config import EngineConfig
from aioengine.messages.launch import ENGINE_TARGET, EngineLaunch
from aioengine.runtime import ChildSpec, Supervisor
from aioengine.runtime.errors import describe_exitcode
from aioengine.runtime.heap_env import model_process_env


class ReplicaActor:
    """One replica's engine under a supervisor in this (Ray worker) process. Methods run on a
    thread pool (the actor is created with ``max_concurrency`` > 1), so ``wait_dead`` can block
    while others answer."""

    def __init__(self) -> None:
        self._supervisor: Supervisor | None = None
        self._dead = threading.Event()
        self._death = ""

    def node(self) -> tuple[str, str]:
        """(Ray node id, node IP address) of the node this actor runs on."""
        import ray  # only ever imported inside a Ray worker

        node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return ray.get_runtime_context().get_node_id(), node_ip

    def start(self, launch: bytes, timeout: float) -> dict[str, Any]:
        """Spawn the engine with its ``EngineLaunch`` and wait for READY; its payload, with the
        engine's pid (on this node) added."""
        self._supervisor = Supervisor(self._on_death)
        config = EngineConfig.from_msgpack(msgspec.msgpack.decode(launch,
                                                                  type=EngineLaunch).config)
        env = model_process_env(config.cpu_kernels.huge_pages)
        payload = self._supervisor.start([ChildSpec(ENGINE_NAME, ENGINE_TARGET, launch,
                                                     env=env)],
                                         timeout)[ENGINE_NAME]
        return {**payload, "pid": self._supervisor.pid(ENGINE_NAME), "actor_pid": os.getpid()}

    def wait_dead(self, timeout: float) -> str:
        """Block until a child died (its description) or ``timeout`` passed (``""``). The host
        keeps one such call pending; if the actor itself dies, the call fails instead."""
        self._dead.wait(timeout)
        return self._death

    def shutdown(self) -> None:
        """Stop the engine (SIGTERM, grace, SIGKILL of what is left)."""
        if self._supervisor is not None:
            self._supervisor.shutdown()

    def _on_death(self, name: str, exitcode: int | None) -> None:
        if not self._death:
            self._death = f"{name} died ({describe_exitcode(exitcode)})"
        self._dead.set()

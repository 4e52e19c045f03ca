"""Process lifecycle: the busy-loop template every child runs, its events, and supervision.

Child side: implement ``BusyLoopTarget`` and expose a module-level factory
``f(args: bytes) -> BusyLoopTarget``. Parent side: ``Supervisor.start([ChildSpec(name,
"pkg.mod:factory", args)], timeout)`` returns each child's READY payload.
"""

from aioengine.runtime.busy_loop import (
    BusyLoopTarget,
    LoopContext,
    TargetFactory,
    child_main,
    run_busy_loop,
)
from aioengine.runtime.errors import EngineDeadError, EngineStartupError, describe_exitcode
from aioengine.runtime.events import Event, EventDecodeError, EventType, decode_event
from aioengine.runtime.shutdown import ShutdownSignal
from aioengine.runtime.supervisor import ChildSpec, DeathCallback, Supervisor

__all__ = [
    "BusyLoopTarget", "ChildSpec", "DeathCallback", "EngineDeadError", "EngineStartupError",
    "Event", "EventDecodeError", "EventType", "LoopContext", "ShutdownSignal", "Supervisor",
    "TargetFactory", "child_main", "decode_event", "describe_exitcode", "run_busy_loop",
]

"""msgspec Structs that cross process boundaries (encoded as msgpack, never pickled)."""

from aioengine.messages.engine_io import (
    AbortRequests,
    AddRequest,
    ClientMessage,
    EngineFailure,
    EngineMessage,
    EngineStats,
    ProcessMemory,
    RequestDelta,
    StepOutputs,
    TokenLogprob,
    UtilityCall,
    UtilityResult,
)
from aioengine.messages.sampling_params import SamplingParams, StructuredOutputs
from aioengine.messages.worker_io import (
    NewSequence,
    SampledToken,
    ScheduledChunk,
    StepInput,
    StepResult,
    WorkerCall,
    WorkerCallResult,
    WorkerError,
    WorkerInbound,
    WorkerOutbound,
)

__all__ = [
    "AbortRequests", "AddRequest", "ClientMessage", "EngineFailure", "EngineMessage",
    "EngineStats", "NewSequence", "ProcessMemory", "RequestDelta", "SampledToken", "SamplingParams",
    "ScheduledChunk", "StepInput", "StepOutputs", "StepResult", "StructuredOutputs",
    "TokenLogprob", "UtilityCall",
    "UtilityResult", "WorkerCall", "WorkerCallResult", "WorkerError", "WorkerInbound",
    "WorkerOutbound",
]

"""The session core and its two engine drivers.

================  =======================================================================
module            its one job
================  =======================================================================
core              the state machine: create, pause/keep, resume, move, delete; host view
registry          live sessions and their one-operation-at-a-time locks
admission         the FIFO queue in front of the pool's blocks (wait instead of 507)
events            the event log: build, commit with the row, notify listeners
mover             tier slots, and byte copies keyed by (source medium, destination medium)
transitions       every change of a session's state, and the tally of sessions by state
recovery          re-attach sessions from SQLite at start
drain             park everything into persistent tiers before the daemon stops
inprocess         the driver for an engine in this process (the reference engine): generate
limits            what a generate may ask for, and the 507 of a full pool
external          the manager for an engine that runs the model itself (vLLM's connector)
================  =======================================================================
"""

from agentpark.parking.core import (
    CoreOptions,
    EngineHost,
    KVHost,
    MoveResult,
    PauseAdvice,
    PauseOrder,
    PauseResult,
    ResumeResult,
    SessionCore,
)
from agentpark.parking.drain import drain
from agentpark.parking.external import ExternalManager, Restored, external_core
from agentpark.parking.inprocess import GenerateResult, InProcessDriver, in_process_core
from agentpark.parking.mover import ArrayPool, EnginePool, Mover
from agentpark.parking.registry import LiveSession, Registry

__all__ = [
    "ArrayPool",
    "CoreOptions",
    "EngineHost",
    "EnginePool",
    "ExternalManager",
    "GenerateResult",
    "InProcessDriver",
    "KVHost",
    "LiveSession",
    "MoveResult",
    "Mover",
    "PauseAdvice",
    "PauseOrder",
    "PauseResult",
    "Registry",
    "Restored",
    "ResumeResult",
    "SessionCore",
    "drain",
    "external_core",
    "in_process_core",
]

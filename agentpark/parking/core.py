"""The session core: one state machine for every engine.

::

                pause                 copy done
     ACTIVE ----------> PAUSING ------------------> PARKED(tier)
       ^                                              |
       |  copy done         resume / generate         |
       +---------- RESUMING <-------------------------+
       |                                              | parked copy gone or damaged
       +---------- RECOMPUTING <--------------------- LOST
     any state --delete--> DELETED (blocks and tier slots freed, row kept)

The core knows sessions, blocks, tiers and events, not who runs the model: that is the
:class:`KVHost` it is given, an engine driver (agentpark.parking.inprocess for the
reference engine, agentpark.parking.external for an engine in another process). Nothing
is freed before its copy is complete, and a failed step leaves the session where it was.
Every session keeps its token log, so KV that is gone is rebuilt: slower, never lost.

Everything here is synchronous and thread-safe; the API calls it from worker threads.
The KV invariant: a session with KV holds exactly ``blocks_for(len(tokens))`` blocks
covering every token of its log.
"""

from __future__ import annotations

from agentpark.parking.pausing import Pausing
from agentpark.parking.restoring import Restoring
from agentpark.parking.types import (
    CoreOptions,
    EngineHost,
    KVHost,
    MoveResult,
    PauseAdvice,
    PauseOrder,
    PauseResult,
    ResumeResult,
)

__all__ = [
    "CoreOptions",
    "EngineHost",
    "KVHost",
    "MoveResult",
    "PauseAdvice",
    "PauseOrder",
    "PauseResult",
    "ResumeResult",
    "SessionCore",
]


class SessionCore(Pausing, Restoring):
    """Owns the live sessions; drives the mover and the event log for them.

    Built by an engine driver's factory (``in_process_core``, ``external_core``), which
    gives it the driver as its :class:`KVHost`.
    """

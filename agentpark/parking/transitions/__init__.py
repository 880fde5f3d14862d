"""Every change of a session's state, in one package: the only code that assigns ``row.state``.

=================  =====================================================================
begin_park         ACTIVE -> PAUSING: tier slots reserved (all or nothing)
park_into          PAUSING -> PARKED: the mover copies, then finish_park commits
finish_park        PAUSING -> PARKED: the copy is in the slots (copied here or by an engine)
abort_park         PAUSING -> ACTIVE: the slots freed, a ``pause_failed`` event if it failed
keep               ACTIVE -> ACTIVE: a pause the advisor did not park
begin_restore      PARKED -> RESUMING, LOST -> RECOMPUTING
finish_restore     RESUMING | RECOMPUTING -> ACTIVE: the blocks hold the session's KV
abort_restore      RESUMING -> PARKED, RECOMPUTING -> LOST: a ``restore_failed`` event
lose               any -> LOST with a reason (checksum, tier file gone, drain, ttl, restart)
turn               PARKED | LOST | ACTIVE -> ACTIVE: an external engine computed a turn
tool_return        the agent is back from its tool: how long the tool took
delete             any -> DELETED
moved_out          PARKED -> DELETED: handed to another daemon (an event names it)
moved_in           none -> PARKED: taken over from another daemon, verified
=================  =====================================================================

Pausing, restoring, the in-process driver's pressure relief, drain and the external
manager all call these; none of them writes a state itself. Each commits the row with the
events that explain it in one write, and updates the registry's tally of sessions by
state right where it changes the row (and again after a refused write, which puts the row
back): the tally is never a side effect of an attribute. A step that fails leaves the
session as it was, its blocks and slots included.
"""

from __future__ import annotations

from agentpark.parking.transitions.ends import Endings
from agentpark.parking.transitions.moves import Moves
from agentpark.parking.transitions.parks import Parks
from agentpark.parking.transitions.restores import Restores

__all__ = ["Transitions"]


class Transitions(Parks, Restores, Endings, Moves):
    """The state machine's edges over one core's event log, tally, mover and host.

    Every method expects the caller to hold the session (its registry operation).
    """

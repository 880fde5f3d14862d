"""Sessions that move between daemons: export, import, the hand-over record, the push.

A parked session goes from a source daemon to a target daemon over the target's REST API
(``/v1/moves/in``), pushed by the source when an operator asks it (``POST /v1/moves``,
``agentpark session move``, ``agentpark drain --to``)::

    source                                      target
    record: sending ------- manifest ---------> reserve slots by content (507: no room,
                                                409: another model or layout)
                    <------ missing blocks ----  (those it already holds are not sent)
    read a chunk ---------- blocks + digests --> verify each block, write its slot
    (a dropped connection: ask again, send only what is still missing)
    record: committing ---- commit ------------> row PARKED + moved_in event (one write):
                    <------ committed ----------  the target owns it from here
    moved_out event, slots freed; record: done

Who owns the session after a crash: the target when its row has the ``moved_in`` event
of the move; else the source. A source that restarts with a move ``committing`` cannot
tell, so it holds the session (serves nothing of it) until the move is run again, which
asks the target and finishes the hand-over either way.
"""

from agentpark.moving.service import MoveService

__all__ = ["MoveService"]

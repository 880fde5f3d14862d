"""Sessions that move between daemons: export, import, the hand-over record, the push.

Parked sessions go from a source daemon to a target daemon, pushed by the source when an
operator asks it (``POST /v1/moves``, ``agentpark session move``, ``agentpark drain
--to``), a batch of sessions at a time (one for a single move, ``[moves]
batch_sessions`` for a drain)::

    source                                      target
    records: sending -- manifests (batch) -----> reserve slots by content, each session
                                                 (507: no room, 409: another model or
                    <--- missing blocks, each --  layout: that one refused, others go)
                    <--- one-time data ticket --  (where the data port is served)
    one data connection: ticket, then every --> ticket checked (once, unexpired); each
    missing block from the tier's mapping        block read into its slot, verified
    (or HTTP chunks: older peer, port off)
    (a dropped connection: begin again, send only what is still missing)
    records: committing -- commit (batch) -----> every row PARKED + moved_in event, ONE
                    <--- committed, each -------  transaction: the target owns them
    moved_out events, ONE transaction; slots freed; records: done

Who owns a session after a crash: the target when its row has the ``moved_in`` event of
the move; else the source. A source that restarts with a move ``committing`` cannot tell,
so it holds the session (serves nothing of it) until the move is run again, which asks
the target and finishes the hand-over either way. Modules: ``batch`` (the source's
batches), ``exports`` (its records, manifests, HTTP chunks), ``datasend``; ``batchin``,
``imports``, ``landing``, ``dataport``, ``ticket`` (the target's).
"""

from agentpark.moving.service import MoveService

__all__ = ["MoveService"]

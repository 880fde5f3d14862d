"""GET /v1/events/stream: the caller's tenant's committed events, as server-sent events.

Each event is one SSE message: ``id:`` the event's id (increasing), ``data:`` the event
as ``GET /v1/events`` shows it (JSON, one line). A client that reconnects with
``Last-Event-ID`` (EventSource does) or ``?after=ID`` first gets the events after that id
from the database, then the live ones. The stream ends with an ``overflow`` message when
the client reads too slowly (it resumes from its last id), with a ``closed`` message when
the daemon stops. Comments (``: keep-alive``) keep idle connections open.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from agentpark.api.deps import AUTH_ERRORS, SessionsCaller
from agentpark.api.errors_wire import error_responses
from agentpark.errors import InvalidRequestError, NotReadyError, TooManyStreamsError
from agentpark.eventstream import EventHub, Subscription
from agentpark.schemas.sessions import EventOut
from agentpark.store.models import EventRow
from agentpark.store.repository import SessionStore

__all__ = ["EventStreamResponse", "router"]

router = APIRouter(tags=["events"])

REPLAY_PAGE = 500  # events read from the database at a time when resuming
_MAX_ID = 2**63 - 1

_DESCRIPTION = """\
An event stream (`text/event-stream`). Each committed event of the caller's tenant is one
message: `id:` the event id, `data:` the event (the `EventOut` of `GET /v1/events`) as
one JSON line. Lines starting with `:` are keep-alive comments. Two named messages end the
stream: `event: overflow` (the client read too slowly; resume with `Last-Event-ID`) and
`event: closed` (the daemon is stopping). Their `data:` is `{"last_event_id": int | null,
"message": str}`.
"""


class EventStreamResponse(StreamingResponse):
    """``text/event-stream``; the route's ``response_class`` is plain StreamingResponse
    (no media type of its own), so the spec keeps the errors as JSON."""

    def __init__(
        self,
        content: AsyncIterator[str],
        headers: dict[str, str] | None = None,
        background: BackgroundTask | None = None,
    ) -> None:
        super().__init__(
            content, headers=headers, media_type="text/event-stream", background=background
        )


_STREAM_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "description": _DESCRIPTION,
        "content": {
            "text/event-stream": {
                "schema": {"type": "string"},
                "example": 'id: 42\ndata: {"id": 42, "session_id": "s1", "kind": "pause"}\n\n',
            }
        },
    }
}


@router.get(
    "/v1/events/stream",
    response_class=StreamingResponse,
    responses={
        **_STREAM_ANSWER,
        **error_responses(TooManyStreamsError, InvalidRequestError, NotReadyError, *AUTH_ERRORS),
    },
)
async def get_event_stream(
    caller: SessionsCaller,
    request: Request,
    after: Annotated[
        int | None, Query(ge=0, le=_MAX_ID, description="resume after this event id")
    ] = None,
    follow: Annotated[
        bool, Query(description="false: only the stored events after `after`, then end")
    ] = True,
    last_event_id: Annotated[
        int | None,
        Header(alias="Last-Event-ID", ge=0, le=_MAX_ID, description="resume (wins over `after`)"),
    ] = None,
) -> EventStreamResponse:
    """The tenant's events as they are committed (server-sent events).

    429 ``too_many_streams`` past the tenant's or the daemon's number of streams.
    """
    hub: EventHub = request.app.state.streams
    start = last_event_id if last_event_id is not None else after
    # Subscribed before the stored events are read: nothing committed meanwhile is missed.
    sub = hub.subscribe(caller.tenant) if follow else None
    keepalive_s = caller.runtime.settings.limits.stream_keepalive_s
    body = _frames(hub, sub, caller.parking.store, caller.tenant, start, keepalive_s)
    return EventStreamResponse(
        body,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        # The body may never start (the client left first): the subscription goes anyway.
        background=None if sub is None else BackgroundTask(hub.unsubscribe, sub),
    )


def _frame(event: EventRow) -> str:
    return f"id: {event.id}\ndata: {EventOut.of(event).model_dump_json()}\n\n"


def _final(name: str, last: int | None, message: str) -> str:
    payload = {"last_event_id": last, "message": message}
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n"


async def _frames(
    hub: EventHub,
    sub: Subscription | None,
    store: SessionStore,
    tenant: str,
    after: int | None,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """The stored events after ``after``, then (``sub``) the live ones."""
    last: int | None = after
    try:
        if after is not None:
            while True:
                rows = await run_in_threadpool(store.events_after, tenant, last or 0, REPLAY_PAGE)
                for row in rows:
                    yield _frame(row)
                    last = row.id
                if len(rows) < REPLAY_PAGE:
                    break
        if sub is None:
            return
        floor = last or 0  # live events up to here were in the replay
        yield ": connected\n\n"
        while True:
            events = await sub.wait(keepalive_s)
            for event in events:
                if event.id > floor:
                    yield _frame(event)
                    last = event.id
            if sub.overflowed:
                why = "the client read too slowly; resume from last_event_id"
                yield _final("overflow", last, why)
                return
            if sub.closed:
                yield _final("closed", last, "the daemon is stopping")
                return
            if not events:
                yield ": keep-alive\n\n"
    finally:
        if sub is not None:
            hub.unsubscribe(sub)

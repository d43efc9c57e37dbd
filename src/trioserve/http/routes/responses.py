"""The Responses API: ``/v1/responses``.

- ``POST /v1/responses``: a response, answered as one ``Response`` object or streamed as
  typed events (SSE with ``event:`` names). A foreground response is an ordinary request
  of the client's connection (the same lifecycle as chat completions: its client leaving
  aborts it). With ``background: true`` it runs in the response store's task instead
  (``responses_store.py``) and goes on when the client leaves; a streamed background
  request follows its events as ``GET ...?stream=true`` does.
- ``GET /v1/responses/{id}``: the ``Response`` object as of now; with ``?stream=true``
  (background responses), its retained events after ``starting_after``, then the live
  ones until it ends or the client leaves (which ends nothing but the following).
- ``POST /v1/responses/{id}/cancel``: end a background response (one abort).
- ``DELETE /v1/responses/{id}``: forget a response (cancelling it first if it runs).

A response is visible only to the API key that created it; to another key it does not
exist (404, as an unknown id).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import attrs
import trio

from ...ends import EndReason
from ..bodies.responses import ResponseGeneration, ResponsesRequest, parse_response, resolve_media
from ..bodies.validation import INT_MAX, parse_bool
from ..errors import HTTPError
from ..exchange import JSON_HEADERS, Exchange
from ..lifecycle import ERROR_WRITE_TIMEOUT, RequestHandle
from ..openapi.content import Doc, json_body, sse_events
from ..responses_store import RecordWriter, StoredResponse
from ..services import Services, with_session
from ..writers.response_events import ResponseEvents
from ..writers.response_items import new_response_id, sse
from ..writers.responses import ResponsesJSONWriter, ResponsesSSEWriter
from ..writers.stream import SSE_HEADERS, SSE_KEEPALIVE, Writer
from .route import Route, Routes, generation_doc

PREFIX = "/v1/responses/"
#: Retained events sent in one write when a stream is replayed.
REPLAY_BATCH = 256


async def create(services: Services, exchange: Exchange) -> None:
    timeout = services.begin(exchange)
    body = await services.json_body(exchange)
    generation = parse_response(
        body, exchange.request_id, services.resolve_model, parsers=services.parsers
    )
    events = generation.events(new_response_id())
    generation = await prepared(services, generation, events, exchange.key_index)
    if generation.background:
        await _create_background(services, exchange, generation, events, timeout)
        return
    on_done = partial(services.responses.keep, owner=exchange.key_index)
    writer: Writer
    if generation.stream:
        writer = ResponsesSSEWriter(exchange, events, on_done if generation.store else None)
        keepalive = services.settings.sse_keepalive
    else:
        writer = ResponsesJSONWriter(exchange, events, on_done if generation.store else None)
        keepalive = 0
    await services.run(exchange, generation.submit, "chat", writer, timeout, keepalive=keepalive)


async def prepared(
    services: Services, generation: ResponseGeneration, events: ResponseEvents, owner: int | None
) -> ResponseGeneration:
    """``generation`` ready to submit: its media resolved and, with
    ``previous_response_id``, the stored conversation it continues put ahead of its input
    (a 404 when this key has no such response: another key's does not exist for it; 409
    while it still runs). Sets ``events.inputs``, the conversation a later turn continues.
    """
    generation = await resolve_media(generation, services.media_fetcher())
    history: list[dict[str, Any]] = []
    if generation.previous is not None:
        record = services.responses.get(generation.previous, owner)
        if record is None:
            raise HTTPError(
                404,
                f"no previous response {generation.previous[:80]!r} here: it is kept only "
                "by the frontend that created it, for this key, for --responses-ttl after "
                "it ends, and only with store: true",
                "previous_response_not_found",
                param="previous_response_id",
            )
        if not record.finished:
            raise HTTPError(
                409,
                f"response {generation.previous[:80]!r} is still running: continue it once "
                "it has ended",
                "previous_response_in_progress",
                param="previous_response_id",
            )
        history = record.conversation()
        events.inputs = [*history, *generation.input_messages]
        return generation.continuing(history)
    events.inputs = list(generation.input_messages)
    return generation


async def _create_background(
    services: Services,
    exchange: Exchange,
    generation: ResponseGeneration,
    events: ResponseEvents,
    timeout: float,
) -> None:
    store = services.responses
    owner = exchange.key_index
    # The engine knows a background response by its id (unique, so never a duplicate);
    # DELETE /v1/requests/{response id} ends it too.
    submit = with_session(exchange, attrs.evolve(generation.submit, request_id=events.id))
    handle = RequestHandle(
        events.id,
        owner=owner,
        route=exchange.path,
        transport=RecordWriter.transport,
        client=exchange.head.client,
        headers=exchange.headers,
        arrived=exchange.arrived,
    )
    record = StoredResponse(events, owner, handle)

    async def run() -> None:
        # No client to watch: it goes on when the one that created it leaves.
        await services.generations.run(
            handle, submit, generation.capability, RecordWriter(store, record), timeout
        )

    store.start_background(record, run)
    if generation.stream:
        await follow(services, exchange, record, -1)
    else:
        await exchange.respond(200, events.snapshot_json(), JSON_HEADERS)


async def retrieve(services: Services, exchange: Exchange) -> None:
    """``GET /v1/responses/{id}[?stream=true[&starting_after=N]]``."""
    response_id = _response_id(exchange)
    query = _query(exchange)
    stream = _query_bool(query, "stream")
    after = _query_int(query, "starting_after")
    record = _owned(services, exchange, response_id)
    if not stream:
        await exchange.respond(200, record.events.snapshot_json(), JSON_HEADERS)
        return
    if not record.background:
        raise HTTPError(
            400,
            f"response {response_id!r} was not created with background: true; only "
            "background responses can be streamed again",
            "response_not_streamable",
        )
    await follow(services, exchange, record, -1 if after is None else after)


async def cancel(services: Services, exchange: Exchange) -> None:
    """``POST /v1/responses/{id}/cancel``: the final ``Response`` object (``cancelled``)."""
    response_id = exchange.path.removeprefix(PREFIX).removesuffix("/cancel")
    record = _owned(services, exchange, response_id)
    if not record.background:
        raise HTTPError(
            400,
            f"response {response_id!r} was not created with background: true; only "
            "background responses can be cancelled",
            "response_not_background",
        )
    if not record.finished:
        assert record.handle is not None
        record.handle.end(EndReason.CANCEL)
        # Its task writes the response.failed (cancelled) at once; the abort has left.
        with trio.move_on_after(ERROR_WRITE_TIMEOUT):
            await record.done.wait()
    elif record.events.status != "cancelled":
        raise HTTPError(
            409,
            f"response {response_id!r} has already ended ({record.events.status})",
            "response_already_finished",
        )
    await exchange.respond(200, record.events.snapshot_json(), JSON_HEADERS)


async def delete(services: Services, exchange: Exchange) -> None:
    """``DELETE /v1/responses/{id}``."""
    response_id = _response_id(exchange)
    record = _owned(services, exchange, response_id)
    services.responses.delete(record)
    await exchange.respond_json(200, {"id": response_id, "object": "response", "deleted": True})


async def follow(
    services: Services, exchange: Exchange, record: StoredResponse, after: int
) -> None:
    """Stream ``record``'s events after sequence number ``after`` as SSE: the retained
    ones, then the live ones, until the response has ended or the client leaves.

    Nothing here holds the response back: its events are already retained (bounded), so
    a follower that reads slowly only falls behind, and one that leaves ends nothing.
    """
    keepalive = services.settings.sse_keepalive
    await exchange.start(200, SSE_HEADERS)

    async def relay() -> None:
        position = after + 1
        while True:
            retained = record.retained
            if position < len(retained):
                batch = retained[position : position + REPLAY_BATCH]
                position += len(batch)
                last = record.finished and position >= len(record.retained)
                await exchange.body(sse(batch), more=not last)
                if last:
                    return
            elif record.finished:
                await exchange.body(b"", more=False)
                return
            else:
                with trio.move_on_after(keepalive if keepalive > 0 else math.inf) as waited:
                    await record.wait_beyond(position)
                if waited.cancelled_caught:
                    await exchange.body(SSE_KEEPALIVE)

    await _until_disconnect(exchange, relay)


async def _until_disconnect(exchange: Exchange, work: Callable[[], Awaitable[None]]) -> None:
    """Run ``work()``; cancel it if the client leaves first."""
    with trio.CancelScope() as scope:
        async with exchange.watch_disconnect(scope.cancel):
            await work()


def _response_id(exchange: Exchange) -> str:
    """The ``{id}`` of ``/v1/responses/{id}`` (the route table matched it: not empty)."""
    return exchange.path.removeprefix(PREFIX)


def _owned(services: Services, exchange: Exchange, response_id: str) -> StoredResponse:
    record = services.responses.get(response_id, exchange.key_index)
    if record is None:
        # Another key's response answers as an unknown one: its existence is not revealed.
        raise HTTPError(
            404,
            f"no response {response_id[:80]!r} here: a response is kept only by the "
            "frontend that created it, and only for --responses-ttl after it ends "
            "(see docs/api.md)",
            "response_not_found",
        )
    return record


def _query(exchange: Exchange) -> dict[str, str]:
    raw = exchange.head.query_string
    try:
        parsed = parse_qs(raw.decode("ascii"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        raise HTTPError(400, "the query string cannot be read", "invalid_query") from None
    return {name: values[-1] for name, values in parsed.items()}


def _query_bool(query: dict[str, str], name: str) -> bool:
    value = query.get(name)
    if value is None:
        return False
    try:
        return parse_bool(value)
    except ValueError:
        raise HTTPError(
            400, f"{name} must be true or false", "invalid_query_parameter", param=name
        ) from None


def _query_int(query: dict[str, str], name: str) -> int | None:
    value = query.get(name)
    if value is None:
        return None
    # (ASCII digits only: the query is percent-decoded, and "²" is a digit to isdigit.)
    if not (value.isascii() and value.isdigit()) or len(value) > 19 or int(value) > INT_MAX:
        raise HTTPError(
            400,
            f"{name} must be a sequence number (a non-negative integer)",
            "invalid_query_parameter",
            param=name,
        )
    return int(value)


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("POST", "/v1/responses"): Route(
        create,
        generation_doc(
            "createResponse",
            "A response (the Responses API): JSON, or typed events (SSE)",
            ResponsesRequest,
            {**json_body("Response"), "text/event-stream": sse_events("ResponseEvent")},
            description="With background: true it runs in the server, not in this "
            "connection: the answer is the queued Response (or, streamed, its events), "
            "and GET /v1/responses/{id} follows it. More 503 codes here: "
            "too_many_background_responses, response_store_full.",
            example={"input": "Hello!", "max_output_tokens": 16},
            links={
                name: (operation, "$response.body#/id")
                for name, operation in (
                    ("retrieve", "retrieveResponse"),
                    ("cancel", "cancelResponse"),
                    ("delete", "deleteResponse"),
                )
            },
        ),
        "chat",
    ),
}

RESPONSE_ID = "the response's id (resp_...)"
RESPONSE_NOT_FOUND = (
    "no such response for this key on this frontend, or it expired (response_not_found)",
    json_body("Error"),
)

#: Routes whose path holds a parameter, ``{id}`` (``table.py`` matches them).
TEMPLATED: Routes = {
    ("GET", "/v1/responses/{id}"): Route(
        retrieve,
        Doc(
            "retrieveResponse",
            "A stored response as of now; with stream=true, a background response's events",
            "responses",
            ok={**json_body("Response"), "text/event-stream": sse_events("ResponseEvent")},
            parameter=RESPONSE_ID,
            query={
                "stream": (
                    {"type": "boolean"},
                    "replay the retained events, then follow the live ones (SSE)",
                ),
                "starting_after": (
                    {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                    "with stream: only the events after this sequence_number",
                ),
            },
            others={
                400: (
                    "the query does not read (invalid_query_parameter), or stream of a "
                    "response not made in the background (response_not_streamable)",
                    json_body("Error"),
                ),
                404: RESPONSE_NOT_FOUND,
            },
        ),
    ),
    ("POST", "/v1/responses/{id}/cancel"): Route(
        cancel,
        Doc(
            "cancelResponse",
            "Cancel a background response (its engine request gets one abort)",
            "responses",
            ok=json_body("Response"),
            parameter=RESPONSE_ID,
            others={
                400: ("not a background response (response_not_background)", json_body("Error")),
                404: RESPONSE_NOT_FOUND,
                409: ("it ended otherwise (response_already_finished)", json_body("Error")),
            },
        ),
    ),
    ("DELETE", "/v1/responses/{id}"): Route(
        delete,
        Doc(
            "deleteResponse",
            "Forget a stored response (a background one still running is cancelled first)",
            "responses",
            ok=json_body("ResponseDeleted"),
            parameter=RESPONSE_ID,
            others={404: RESPONSE_NOT_FOUND},
        ),
    ),
}

"""The Responses API's parts (``POST /v1/responses``), without I/O: the ids, the usage
object, a ``function_call`` output item, the statuses and reasons a response reports,
and the Server-Sent Events framing of its typed events.
:class:`~.response_events.ResponseEvents` builds a response and its events from them."""

from __future__ import annotations

from typing import Any

from ...protocol import Usage
from ..exchange import new_request_id

#: One typed event: its ``type`` and the event object as JSON.
Event = tuple[str, bytes]

#: Statuses a response never leaves.
FINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
#: Engine finish reasons that make a response ``incomplete``, and the reason it reports.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}
#: The error code of a cancelled request (``EndReason.CANCEL``'s): its response is
#: ``cancelled``, not ``failed``.
CANCELLED_CODE = "request_cancelled"


def new_response_id() -> str:
    """A response id: ``resp_`` and 32 random hex digits. It encodes nothing (not the
    frontend, not the engine): see docs/api.md on routing ``GET /v1/responses/{id}``."""
    return f"resp_{new_request_id()}"


def usage_object(usage: Usage | None) -> dict[str, Any] | None:
    """``usage`` in the Responses API's shape."""
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        # (0 where the engine does not say: the field is not optional in this API.)
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def sse(events: list[Event]) -> bytes:
    """``events`` as Server-Sent Events, each named by its type."""
    return b"".join(b"event: %s\ndata: %s\n\n" % (name.encode(), data) for name, data in events)


class FunctionCall:
    """A ``function_call`` output item: the call's ids, name and arguments so far."""

    __slots__ = ("call_id", "done", "id", "name", "parts")

    def __init__(self, call_id: str, name: str) -> None:
        self.id = f"fc_{new_request_id()}"
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []
        self.done = False

    def item(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function_call",
            "call_id": self.call_id,
            "name": self.name,
            "arguments": "".join(self.parts),
            "status": "completed" if self.done else "in_progress",
        }


#: The output items of a response, in order: its reasoning, its message, each call.
REASONING, MESSAGE = "reasoning", "message"

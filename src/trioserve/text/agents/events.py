"""What the parsers make of a model's text: typed events, and the answer they add up to.

A parser is fed the text as it comes, in any chunks, and answers events; the same text
gives the same events whatever the chunking, once adjacent deltas of one kind are joined
(:func:`joined`). A route only formats them (``http/writers/openai.py``).
"""

from __future__ import annotations

import uuid

import attrs


@attrs.frozen
class TextDelta:
    """Answer text (the ``content``)."""

    text: str


@attrs.frozen
class ReasoningDelta:
    """Thinking, split from the answer (the ``reasoning`` field)."""

    text: str


@attrs.frozen
class ToolCallStart:
    """A call begins: its name is known. ``index`` counts the calls of one answer from 0."""

    index: int
    id: str
    name: str


@attrs.frozen
class ToolCallArguments:
    """More of call ``index``'s arguments (JSON text), as the model generated them."""

    index: int
    text: str


@attrs.frozen
class ToolCallEnd:
    """Call ``index`` is over. ``complete``: its arguments are a whole JSON value; False
    when the model broke the call off (malformed, or cut by ``max_tokens``) after its
    name had been sent."""

    index: int
    complete: bool = True


Event = TextDelta | ReasoningDelta | ToolCallStart | ToolCallArguments | ToolCallEnd


def tool_call_id() -> str:
    """A call id as vLLM makes them (``make_tool_call_id``: ``random_uuid``, 16 hex
    digits of a UUID4)."""
    return f"chatcmpl-tool-{uuid.uuid4().int & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def joined(events: list[Event]) -> list[Event]:
    """``events`` with adjacent deltas of one kind (and one call) joined: the form in
    which the result of a text does not depend on how it was chunked."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextDelta | ReasoningDelta) and type(last) is type(event):
            out[-1] = type(event)(last.text + event.text)
        elif (
            isinstance(event, ToolCallArguments)
            and isinstance(last, ToolCallArguments)
            and last.index == event.index
        ):
            out[-1] = ToolCallArguments(event.index, last.text + event.text)
        elif not (
            isinstance(event, TextDelta | ReasoningDelta | ToolCallArguments) and not event.text
        ):
            out.append(event)
    return out


@attrs.define
class ToolCall:
    id: str
    name: str
    arguments: str = ""
    complete: bool = False


@attrs.define
class Answer:
    """The events of a whole answer, added up (what a non-streamed answer shows)."""

    content: list[str] = attrs.Factory(list)
    reasoning: list[str] = attrs.Factory(list)
    calls: list[ToolCall] = attrs.Factory(list)

    def add(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, TextDelta):
                self.content.append(event.text)
            elif isinstance(event, ReasoningDelta):
                self.reasoning.append(event.text)
            elif isinstance(event, ToolCallStart):
                self.calls.append(ToolCall(event.id, event.name))
            elif isinstance(event, ToolCallArguments):
                self.calls[event.index].arguments += event.text
            else:
                self.calls[event.index].complete = event.complete

    @property
    def text(self) -> str | None:
        return "".join(self.content) if self.content else None

    @property
    def thinking(self) -> str | None:
        return "".join(self.reasoning) if self.reasoning else None

"""``hermes`` (Hermes 2 Pro, Qwen 2.5 and Qwen 3's JSON form): each call is
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

As vLLM's ``Hermes2ProToolParser``: the answer's content is the text before the first
call; text after it (between calls, after the last) is not the answer's. A call whose
closing tag is missing but whose object is whole is a call (an answer cut right after it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .calls import ObjectCall, held_marker
from .events import Event, TextDelta
from .stepping import SteppedParser

START = "<tool_call>"
END = "</tool_call>"

# Where the parser is.
_TEXT = 0  # outside calls
_OPEN = 1  # after <tool_call>, before the object's "{"
_CALL = 2  # in the object
_CLOSE = 3  # after the object (or a broken call), until </tool_call>


class HermesToolParser(SteppedParser):
    """Fed the answer's text (after any reasoning) chunk by chunk; answers events."""

    def __init__(
        self, make_id: Callable[[], str], tools: list[dict[str, Any]] | None = None
    ) -> None:
        self.make_id = make_id
        self.state = _TEXT
        self.buffer = ""  # text not yet decided on
        self.held = ""  # the text of the call being read, until it is known to be one
        self.calls = 0
        self.call: ObjectCall | None = None

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self.state == _TEXT:
            self._text(self.buffer, out)
        elif self.state in (_OPEN, _CALL):
            if self.call is not None:
                out += self.call.close()
            if self.call is None or self.call.failed:
                self._text(self.held + (self.call.text if self.call else "") + self.buffer, out)
        self.buffer = self.held = ""
        self.state = _TEXT
        return out

    def _text(self, text: str, out: list[Event]) -> None:
        # As vLLM's: only the text before the first call is the answer's content.
        if text and not self.calls:
            out.append(TextDelta(text))

    def _step(self, out: list[Event]) -> None:
        buffer = self.buffer
        if self.state == _TEXT:
            at = buffer.find(START)
            if at < 0:
                keep = held_marker(buffer, START)
                self._text(buffer[: len(buffer) - keep], out)
                self.buffer = buffer[len(buffer) - keep :]
                return
            self._text(buffer[:at], out)
            self.held, self.buffer, self.state = START, buffer[at + len(START) :], _OPEN
        elif self.state == _OPEN:
            stripped = buffer.lstrip()
            if not stripped:
                self.held, self.buffer = self.held + buffer, ""
            elif stripped[0] == "{":
                self.held += buffer[: len(buffer) - len(stripped)]
                self.call = ObjectCall(self.calls, self.make_id, hold_space=True)
                self.buffer, self.state = stripped, _CALL
            else:  # not a call: the model's text
                self._text(self.held, out)
                self.held, self.state = "", _TEXT
        elif self.state == _CALL:
            call = self.call
            assert call is not None
            self.buffer = ""
            out += call.feed(buffer)
            if call.failed:
                self._text(self.held + call.text, out)
                self.held, self.call, self.state = "", None, _TEXT
            elif call.finished:
                self.calls += 1
                self.held, self.call = "", None
                self.buffer, self.state = call.rest, _CLOSE
        else:  # _CLOSE: skip to the closing tag (what is between is no one's)
            at = buffer.find(END)
            if at >= 0:
                self.buffer, self.state = buffer[at + len(END) :], _TEXT
            else:
                self.buffer = buffer[len(buffer) - held_marker(buffer, END) :]

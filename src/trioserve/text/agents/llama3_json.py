"""``llama3_json`` (Llama 3.1-3.3 and 4's JSON calls): the answer is one call object or
several separated by ``;``, optionally after ``<|python_tag|>``:
``{"name": "get_weather", "parameters": {"city": "Paris"}}`` (``arguments`` is read too).

As vLLM's ``Llama3JsonToolParser`` streams: calls only when the answer begins with one
(else the answer is text); what follows the calls is not the answer's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .calls import ObjectCall
from .events import Event, TextDelta
from .stepping import SteppedParser

PYTHON_TAG = "<|python_tag|>"

_START = 0  # nothing decided yet
_TEXT = 1  # the answer is text
_CALL = 2  # in a call's object
_BETWEEN = 3  # after a call: ";" and another, or the end of the calls
_NEXT = 4  # after ";": the next call's "{"
_OVER = 5  # after the calls: nothing more is the answer's


class Llama3JsonToolParser(SteppedParser):
    def __init__(
        self, make_id: Callable[[], str], tools: list[dict[str, Any]] | None = None
    ) -> None:
        self.make_id = make_id
        self.state = _START
        self.buffer = ""
        self.calls = 0
        self.call: ObjectCall | None = None

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self.state in (_START, _TEXT) and self.buffer:
            out.append(TextDelta(self.buffer))
        elif self.state == _CALL and self.call is not None:
            out += self.call.close()
            if self.call.failed and not self.calls:
                out.append(TextDelta(self.call.text))
        self.buffer, self.state = "", _OVER
        return out

    def _step(self, out: list[Event]) -> None:
        buffer = self.buffer
        if self.state == _START:
            if PYTHON_TAG.startswith(buffer):
                return  # maybe the tag
            if buffer.startswith(PYTHON_TAG):
                buffer = self.buffer = buffer[len(PYTHON_TAG) :]
                if not buffer:
                    return
            if buffer.startswith("{"):
                self._call()
            else:
                self.state = _TEXT
        elif self.state == _TEXT:
            out.append(TextDelta(buffer))
            self.buffer = ""
        elif self.state == _CALL:
            call = self.call
            assert call is not None
            self.buffer = ""
            out += call.feed(buffer)
            if call.failed:
                if not self.calls:  # the answer was text after all
                    out.append(TextDelta(call.text))
                    self.state = _TEXT
                else:
                    self.state = _OVER
            elif call.finished:
                self.calls += 1
                self.buffer = call.rest
                self.state = _BETWEEN if call.complete else _OVER
        elif self.state in (_BETWEEN, _NEXT):
            stripped = buffer.lstrip()
            if not stripped:
                self.buffer = ""
            elif self.state == _BETWEEN and stripped[0] == ";":
                self.buffer, self.state = stripped[1:], _NEXT
            elif self.state == _NEXT and stripped[0] == "{":
                self.buffer = stripped
                self._call()
            else:
                self.state = _OVER
        else:  # _OVER
            self.buffer = ""

    def _call(self) -> None:
        self.call = ObjectCall(self.calls, self.make_id, ("parameters", "arguments"))
        self.state = _CALL

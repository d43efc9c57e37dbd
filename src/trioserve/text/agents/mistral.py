"""``mistral`` (Mistral's models): calls after ``[TOOL_CALLS]``, in either of the forms
vLLM's ``MistralToolParser`` reads:

- v11 tokenizers and later: ``[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`` (or
  ``name{...}``), a ``[TOOL_CALLS]`` before each call;
- earlier ones: ``[TOOL_CALLS][{"name": "get_weather", "arguments": {...}}, ...]``.

The content is the text before the first ``[TOOL_CALLS]``; what follows a call's
arguments, up to the next ``[TOOL_CALLS]``, is no one's. Call ids are nine letters and
digits, as Mistral's templates require.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from typing import Any

from .calls import MAX_HELD, held_marker
from .events import Event, TextDelta, ToolCallArguments, ToolCallEnd, ToolCallStart
from .forced import RequiredToolParser
from .jsonscan import ObjectScanner
from .stepping import SteppedParser

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
MAX_NAME = 256

_TEXT, _MARK, _NAME, _ARGS, _AFTER, _ARRAY = range(6)
_ALPHANUMERIC = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    """Nine letters and digits (mistral_common's rule for a call id)."""
    return "".join(random.choices(_ALPHANUMERIC, k=9))


class MistralToolParser(SteppedParser):
    def __init__(
        self, make_id: Callable[[], str], tools: list[dict[str, Any]] | None = None
    ) -> None:
        self.make_id = make_id
        self.state = _TEXT
        self.buffer = ""
        self.held = ""
        self.calls = 0
        self.name = ""
        self.scanner: ObjectScanner | None = None
        self.sent = 0
        self.array: RequiredToolParser | None = None

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self.state == _TEXT:
            self._content(self.buffer, out)
        elif self.state in (_MARK, _NAME):
            self._content(self.held + self.buffer, out)
        elif self.state == _ARGS:
            out.append(ToolCallEnd(self.calls - 1, False))
        elif self.state == _ARRAY and self.array is not None:
            out += self.array.finish()
        self.buffer, self.state = "", _AFTER
        return out

    def _content(self, text: str, out: list[Event]) -> None:
        if text and not self.calls:
            out.append(TextDelta(text))

    def _step(self, out: list[Event]) -> None:
        buffer = self.buffer
        if self.state in (_TEXT, _AFTER):
            at = buffer.find(TOOL_CALLS)
            if at < 0:
                keep = held_marker(buffer, TOOL_CALLS)
                if self.state == _TEXT:
                    self._content(buffer[: len(buffer) - keep], out)
                self.buffer = buffer[len(buffer) - keep :]
                return
            if self.state == _TEXT:
                self._content(buffer[:at], out)
            self.held, self.buffer, self.state = TOOL_CALLS, buffer[at + len(TOOL_CALLS) :], _MARK
        elif self.state == _MARK:
            stripped = buffer.lstrip()
            if not stripped:
                self.held, self.buffer = self.held + buffer, ""
            elif stripped[0] in "[{" and not self.calls:
                self.array = RequiredToolParser(self.make_id, key="arguments")
                self.held, self.buffer, self.state = "", "", _ARRAY
                out += self.array.feed(stripped if stripped[0] == "[" else "[" + stripped)
            else:
                self.held += buffer[: len(buffer) - len(stripped)]
                self.buffer, self.state = stripped, _NAME
        elif self.state == _NAME:
            ends = [(at, m) for m in (ARGS, "{") if (at := buffer.find(m)) >= 0]
            end = min(ends) if ends else None
            name = buffer[: end[0]] if end else buffer
            if len(name) > MAX_NAME or any(c.isspace() for c in name):
                self._content(self.held + buffer, out)  # not a call: the model's text
                self.held, self.buffer, self.state = "", "", _TEXT if not self.calls else _AFTER
                return
            if end is None:
                return  # the name goes on
            at, marker = end
            if not name:
                self._content(self.held + buffer, out)
                self.held, self.buffer, self.state = "", "", _TEXT if not self.calls else _AFTER
                return
            self.name, self.held = name, ""
            self.buffer = buffer[at + len(ARGS) :] if marker == ARGS else buffer[at:]
            self.scanner, self.sent = None, 0
            self.state = _ARGS
        elif self.state == _ARGS:
            self._arguments(out)
        else:  # _ARRAY
            assert self.array is not None
            self.buffer = ""
            out += self.array.feed(buffer)

    def _arguments(self, out: list[Event]) -> None:
        if self.scanner is None:
            stripped = self.buffer.lstrip()
            if not stripped:
                self.buffer = ""
                return
            if stripped[0] != "{" or len(self.buffer) > MAX_HELD:
                self.buffer, self.state = "", _AFTER  # no arguments: not a call
                return
            self.scanner = ObjectScanner()
            out.append(ToolCallStart(self.calls, self.make_id(), self.name))
            self.calls += 1
            self.buffer = stripped
        scanner = self.scanner
        pending, self.buffer = self.buffer, ""
        scanner.feed(pending)
        index = self.calls - 1
        end = scanner.end if scanner.done else scanner.pos
        if end > self.sent and not scanner.error:
            out.append(ToolCallArguments(index, scanner.text[self.sent : end]))
            self.sent = end
        if scanner.done or scanner.error:
            out.append(ToolCallEnd(index, scanner.done))
            self.buffer = scanner.text[scanner.end :] if scanner.done else ""
            self.scanner, self.state = None, _AFTER

"""What the JSON call formats share: one call written as a JSON object, read as it comes.

``{"name": "get_weather", "arguments": {"city": "Paris"}}`` (hermes, llama3_json,
mistral, and the array of ``tool_choice: "required"``). The call starts (its
:class:`ToolCallStart` is sent) once its name is known and its arguments have begun; from
then on the arguments go out as the model writes them, checked character by character.
Before that nothing of it has been sent, so an object that turns out not to be a call is
still the model's text.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .events import Event, ToolCallArguments, ToolCallEnd, ToolCallStart
from .jsonscan import ObjectScanner

#: The most text a call may hold back before it is known to be a call (its name and
#: the start of its arguments); past it the text is the model's text, not a call.
MAX_HELD = 64 * 1024


def held_marker(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ObjectCall:
    """One call in a JSON object, fed its text from the ``{`` on.

    :attr:`started` (the call's start was sent), :attr:`finished` (the object closed, or
    broke: nothing more is the call's), :attr:`failed` (it is not a call: nothing was sent,
    and the text fed is the model's text), :attr:`rest` (what was fed past the object's end).
    """

    def __init__(
        self,
        index: int,
        make_id: Callable[[], str],
        arguments: tuple[str, ...] = ("arguments",),
        name: str | None = None,
        hold_space: bool = False,
    ) -> None:
        self.index = index
        #: Arguments still being written are sent without their trailing whitespace
        #: until more follows (vLLM's hermes parser streams the stripped partial text).
        self.hold_space = hold_space
        self.make_id = make_id
        self.keys = arguments
        self.scanner = ObjectScanner()
        self.name = name
        self.started = False
        self.finished = False
        self.failed = False
        self.complete = False
        self.rest = ""
        self._sent_to = -1  # offset in the scanner's text up to which arguments were sent

    @property
    def text(self) -> str:
        return self.scanner.text

    def feed(self, text: str) -> list[Event]:
        scanner = self.scanner
        scanner.feed(text)
        out: list[Event] = []
        if not self.started:
            self._start(out)
        if self.started:
            self._arguments(out)
        if scanner.done or scanner.error:
            if self.started and not self.finished:
                self.complete = scanner.done and self._arguments_span() is not None
                out.append(ToolCallEnd(self.index, self.complete))
                self.finished = True
            elif not self.started:
                self.failed = True
            if scanner.done:
                self.rest = scanner.text[scanner.end :]
        elif not self.started and len(scanner.text) > MAX_HELD:
            self.failed = True
        return out

    def close(self) -> list[Event]:
        """The text ended: a started call ends broken off; an unstarted one is text."""
        if self.started and not self.finished:
            self.finished = True
            return [ToolCallEnd(self.index, False)]
        if not self.started:
            self.failed = True
        return []

    def _arguments_span(self) -> tuple[int, int] | None:
        for key in self.keys:
            span = self.scanner.member(key)
            if span is not None:
                return span
        return None

    def _start(self, out: list[Event]) -> None:
        scanner = self.scanner
        if self.name is None:
            span = scanner.member("name")
            if span is None:
                return
            name = json.loads(scanner.text[span[0] : span[1]])
            if not isinstance(name, str):
                self.failed = True
                return
            self.name = name
        span = self._arguments_span()
        if span is not None:
            start = span[0]
        elif scanner.key in self.keys and scanner.value_start >= 0:
            start = scanner.value_start
        else:
            return
        self.started = True
        self._sent_to = start
        out.append(ToolCallStart(self.index, self.make_id(), self.name))

    def _arguments(self, out: list[Event]) -> None:
        scanner = self.scanner
        span = self._arguments_span()
        if span is not None:
            end = span[1]
        elif scanner.key in self.keys and scanner.value_start >= 0 and not scanner.error:
            end = scanner.pos
            if self.hold_space:
                end = len(scanner.text[:end].rstrip())
        else:
            return
        if end > self._sent_to:
            out.append(ToolCallArguments(self.index, scanner.text[self._sent_to : end]))
            self._sent_to = end

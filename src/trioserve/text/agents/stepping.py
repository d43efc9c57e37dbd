"""What the tool-call parsers that are state machines over their held text share."""

from __future__ import annotations

from .events import Event


class SteppedParser:
    """A parser that takes its held text (``buffer``) one ``_step`` at a time, as far as the
    text allows: a step that changes neither the state nor the held text waits for more."""

    buffer: str
    state: int

    def _step(self, out: list[Event]) -> None:
        raise NotImplementedError

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self.buffer += text
        while self.buffer:
            before = (self.state, len(self.buffer))
            self._step(out)
            if (self.state, len(self.buffer)) == before:
                break  # waiting for more text
        return out

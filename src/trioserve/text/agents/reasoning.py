"""Reasoning parsers: the model's thinking split from its answer, as vLLM's
``--reasoning-parser`` splits it, from the text alone (no token ids: the same parser
serves every engine).

- ``deepseek_r1``: everything up to ``</think>`` is reasoning (DeepSeek R1's template
  opens the ``<think>`` in the prompt; one the model writes itself is dropped); no
  ``</think>`` at all: all reasoning.
- ``qwen3``: the same, and a ``<tool_call>`` ends the reasoning too (the model went
  straight to a call); with ``enable_thinking: false`` (``chat_template_kwargs``, or
  ``reasoning_effort: "none"``) there is no reasoning, and a stray ``</think>`` in the
  answer is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .calls import held_marker
from .events import Event, ReasoningDelta, TextDelta

THINK_START = "<think>"
THINK_END = "</think>"


class ThinkingParser:
    """``<think>…</think>`` reasoning at the start of an answer."""

    #: Markers that end the reasoning and belong to the answer (they are passed on).
    implicit_ends: tuple[str, ...] = ()
    #: Whether a ``</think>`` met in the answer is dropped rather than kept as text.
    drop_end_in_answer = False
    #: Whether a ``<think>`` anywhere in the reasoning is dropped (else only a leading one).
    drop_start_anywhere = False

    def __init__(self, thinking: bool = True) -> None:
        self.reasoning = thinking
        self.at_start = thinking  # a leading <think> may still come
        self.buffer = ""

    def feed(self, text: str) -> list[Event]:
        self.buffer += text
        out: list[Event] = []
        while self.buffer and self._step(out):
            pass
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self.buffer:
            out.append((ReasoningDelta if self.reasoning else TextDelta)(self.buffer))
        self.buffer = ""
        return out

    def _step(self, out: list[Event]) -> bool:
        """Take what can be decided of the buffer; False when it waits for more text."""
        buffer = self.buffer
        if not self.reasoning:
            if not self.drop_end_in_answer:
                out.append(TextDelta(buffer))
                self.buffer = ""
                return False
            return self._answer_dropping_end(buffer, out)
        if self.at_start:
            if THINK_START.startswith(buffer):
                return False  # still maybe <think>
            self.at_start = False
            if buffer.startswith(THINK_START):
                self.buffer = buffer[len(THINK_START) :]
            return True
        markers = [THINK_END, *self.implicit_ends]
        if self.drop_start_anywhere:
            markers.append(THINK_START)
        found = [(at, m) for m in markers if (at := buffer.find(m)) >= 0]
        if not found:
            keep = max(held_marker(buffer, m) for m in markers)
            if len(buffer) > keep:
                out.append(ReasoningDelta(buffer[: len(buffer) - keep]))
            self.buffer = buffer[len(buffer) - keep :]
            return False
        at, marker = min(found)
        if at:
            out.append(ReasoningDelta(buffer[:at]))
        if marker == THINK_START:
            self.buffer = buffer[at + len(marker) :]
        elif marker == THINK_END:
            self.buffer, self.reasoning = buffer[at + len(marker) :], False
        else:  # an implicit end: the marker is the answer's
            self.buffer, self.reasoning = buffer[at:], False
        return True

    def _answer_dropping_end(self, buffer: str, out: list[Event]) -> bool:
        at = buffer.find(THINK_END)
        if at < 0:
            keep = held_marker(buffer, THINK_END)
            if len(buffer) > keep:
                out.append(TextDelta(buffer[: len(buffer) - keep]))
            self.buffer = buffer[len(buffer) - keep :]
            return False
        if at:
            out.append(TextDelta(buffer[:at]))
        self.buffer = buffer[at + len(THINK_END) :]
        return True


class DeepSeekR1ReasoningParser(ThinkingParser):
    pass


class Qwen3ReasoningParser(ThinkingParser):
    implicit_ends = ("<tool_call>",)
    drop_end_in_answer = True
    drop_start_anywhere = True


def thinking_enabled(template_kwargs: Mapping[str, Any] | None, effort: object) -> bool:
    """Whether the template was asked to think: ``enable_thinking`` (or ``thinking``) in
    ``chat_template_kwargs``, else ``reasoning_effort`` other than ``"none"``, else yes
    (as vLLM's ``ChatCompletionRequest`` builds the template's arguments)."""
    kwargs = template_kwargs or {}
    for key in ("enable_thinking", "thinking"):
        if key in kwargs:
            return bool(kwargs[key])
    if effort is not None:
        return effort != "none"
    return True

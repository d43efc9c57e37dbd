"""One answer's text through the parsers: reasoning first, then tool calls, as the model
writes them; what routes format (``http/writers/openai.py``). Sans-io, for every engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    tool_call_id,
)
from .forced import NamedToolParser, RequiredToolParser
from .formats import REASONING_PARSERS, TOOL_CALL_IDS, TOOL_CALL_PARSERS, StreamParser
from .reasoning import thinking_enabled
from .structural_tags import STRUCTURAL_TAG_MODELS


@attrs.frozen
class ParserNames:
    """The formats a server was started with (``--tool-call-parser``,
    ``--reasoning-parser``), by vLLM's names; None: not parsed."""

    tool_call: str | None = None
    reasoning: str | None = None
    #: vLLM's ``--tool-strict-level``: ``auto``, ``function`` or ``parameter``
    #: (``text/agents/structural_tags.py``).
    tool_strict_level: str = "auto"


@attrs.frozen
class ToolUse:
    """What a request asks of tools, validated (``http/bodies/agents.py``)."""

    tools: list[dict[str, Any]]
    #: "auto", "required", or the one function's name (``named``).
    choice: str
    named: str | None = None
    parallel: bool = True


class OutputParser:
    """Feeds one answer's text (:meth:`feed`, any chunks) through a reasoning parser and a
    tool-call parser, either of which may be absent; :meth:`finish` flushes what was
    held. :attr:`called`: whether a call was started (the finish reason turns to
    ``tool_calls``, unless the call was the named one ``tool_choice`` forced).
    """

    def __init__(
        self,
        reasoning: StreamParser | None,
        tools: StreamParser | None,
        *,
        parallel: bool = True,
        named: bool = False,
        forced: bool = False,
        include_reasoning: bool = True,
    ) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self.parallel = parallel
        #: The call was forced: by a named function (``named``), or ``required``.
        self.named = named
        self.forced = forced or named
        self.include_reasoning = include_reasoning
        self.called = False
        #: The text handed to the tool-call parser (the answer, if its calls broke off).
        self.answer_text: list[str] = []

    def feed(self, text: str) -> list[Event]:
        if self.reasoning is None:
            return self._answer([TextDelta(text)] if text else [])
        return self._answer(self.reasoning.feed(text))

    def finish(self) -> list[Event]:
        events = self.reasoning.finish() if self.reasoning is not None else []
        out = self._answer(events)
        if self.tools is not None:
            out += self._calls(self.tools.finish())
        return out

    def finish_reason(self, engine_reason: str) -> str:
        if self.called and not self.named and engine_reason == "stop":
            return "tool_calls"
        return engine_reason

    def _answer(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if isinstance(event, ReasoningDelta):
                if self.include_reasoning:
                    out.append(event)
            elif self.tools is not None and isinstance(event, TextDelta):
                self.answer_text.append(event.text)
                out += self._calls(self.tools.feed(event.text))
            else:
                out.append(event)
        return out

    def _calls(self, events: list[Event]) -> list[Event]:
        out = []
        for event in events:
            if isinstance(event, ToolCallStart | ToolCallArguments | ToolCallEnd):
                # parallel_tool_calls: false keeps the first call (vLLM's
                # maybe_filter_parallel_tool_calls).
                if event.index and not self.parallel:
                    continue
                self.called = True
            out.append(event)
        return out


def output_parser(
    names: ParserNames,
    tool_use: ToolUse | None,
    template_kwargs: Mapping[str, Any] | None = None,
    reasoning_effort: Any = None,
    include_reasoning: bool = True,
    make_id: Callable[[], str] | None = None,
) -> OutputParser | None:
    """The parser one answer needs, or None when its text is the answer as it is.
    ``make_id``: how its calls are named (default: as vLLM names the format's)."""
    if make_id is None:
        make_id = TOOL_CALL_IDS.get(names.tool_call or "", tool_call_id)
    reasoning = None
    if names.reasoning is not None:
        thinking = thinking_enabled(template_kwargs, reasoning_effort)
        reasoning = REASONING_PARSERS[names.reasoning](thinking)
    tools: StreamParser | None = None
    named = forced = False
    parallel = True
    if tool_use is not None:
        parallel = tool_use.parallel
        named = tool_use.named is not None
        forced = named or tool_use.choice == "required"
        if names.tool_call in STRUCTURAL_TAG_MODELS or (names.tool_call and not forced):
            # A forced call of these formats is in the format's own syntax (the
            # structural tag holds it there), read as vLLM reads it: as "auto".
            tools = TOOL_CALL_PARSERS[names.tool_call](make_id, tool_use.tools)
        elif names.tool_call == "mistral":
            # Mistral's forced call array (structural_tags.mistral_schema).
            tools = RequiredToolParser(make_id, key="arguments")
        elif tool_use.named is not None:
            tools = NamedToolParser(make_id, tool_use.named)
        else:
            tools = RequiredToolParser(make_id)
    if reasoning is None and tools is None:
        return None
    return OutputParser(
        reasoning,
        tools,
        parallel=parallel,
        named=named,
        forced=forced,
        include_reasoning=include_reasoning,
    )

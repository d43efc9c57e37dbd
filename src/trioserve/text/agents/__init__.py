"""Tool calls and reasoning in a model's text, parsed as it streams (sans-io).

``events.py`` (what the parsers answer), ``output.py`` (one answer through a reasoning
and a tool-call parser: :func:`output_parser`), ``formats.py`` (the formats by vLLM's
names, and how to add one), one module per format family, and ``forced.py`` (what
``tool_choice: "required"`` and a named function make the model write).
"""

from .events import (
    Answer,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    joined,
    tool_call_id,
)
from .forced import forced_schema
from .formats import REASONING_PARSERS, TOOL_CALL_PARSERS
from .output import OutputParser, ParserNames, ToolUse, output_parser

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "Answer",
    "Event",
    "OutputParser",
    "ParserNames",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallArguments",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolUse",
    "forced_schema",
    "joined",
    "output_parser",
    "tool_call_id",
]

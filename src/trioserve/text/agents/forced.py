"""What the model writes when ``tool_choice`` forces a call and no tool-call format is
configured, as vLLM's generic path constrains it: the engine is handed a JSON schema
(structured outputs, :func:`forced_schema`), so the answer is exactly the calls. (A
format's forced call is in its own syntax: ``structural_tags.py``.)

- ``"required"``: an array of ``{"name": ..., "parameters": {...}}``, one or more
  (one at most with ``parallel_tool_calls: false``).
- a named function: the arguments object itself; the name is the request's.

The schemas are vLLM's (``vllm/tool_parsers/utils.py``, ``get_json_schema_from_tools``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .calls import ObjectCall
from .events import Event, TextDelta, ToolCallArguments, ToolCallEnd, ToolCallStart
from .jsonscan import ObjectScanner


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    params = function.get("parameters")
    return params if params else {"type": "object", "properties": {}}


def forced_schema(
    tools: list[dict[str, Any]], choice: Any, parallel: bool | None
) -> dict[str, Any] | None:
    """The JSON schema that makes the model answer with the call(s) ``choice`` forces, or
    None when it forces none (``auto``, ``none``)."""
    functions = [t["function"] for t in tools if t.get("type", "function") == "function"]
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        return next(_parameters(f) for f in functions if f["name"] == name)
    if choice != "required":
        return None
    defs: dict[str, Any] = {}
    variants = []
    for function in functions:
        params = dict(_parameters(function))
        defs.update(params.pop("$defs", None) or {})
        variants.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [function["name"]]},
                    "parameters": params,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": variants},
    }
    if parallel is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


class NamedToolParser:
    """The answer is the arguments of the one function ``tool_choice`` names."""

    def __init__(self, make_id: Callable[[], str], name: str) -> None:
        self.make_id = make_id
        self.name = name
        self.scanner: ObjectScanner | None = None
        self.pending = ""  # leading whitespace, or text that is not an object
        self.sent = 0
        self.over = False
        self.as_text = False  # it was not an object: the rest is text too

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        if self.as_text:
            return [TextDelta(text)] if text else []
        if self.over:
            return out
        if self.scanner is None:
            self.pending += text
            stripped = self.pending.lstrip()
            if not stripped:
                return out
            if stripped[0] != "{":
                self.over = self.as_text = True
                out.append(TextDelta(self.pending))
                return out
            self.scanner = ObjectScanner()
            out.append(ToolCallStart(0, self.make_id(), self.name))
            text, self.pending = stripped, ""
        scanner = self.scanner
        scanner.feed(text)
        end = scanner.end if scanner.done else scanner.pos
        if end > self.sent and not scanner.error:
            out.append(ToolCallArguments(0, scanner.text[self.sent : end]))
            self.sent = end
        if scanner.done or scanner.error:
            self.over = True
            out.append(ToolCallEnd(0, scanner.done))
        return out

    def finish(self) -> list[Event]:
        if self.scanner is not None and not self.over:
            self.over = True
            return [ToolCallEnd(0, False)]
        if self.scanner is None and self.pending and not self.over:
            self.over = True
            return [TextDelta(self.pending)]
        return []


class RequiredToolParser:
    """The answer is a JSON array of calls (``tool_choice: "required"``). A text that is
    not (nothing of a call sent yet) is given back as text."""

    def __init__(self, make_id: Callable[[], str], key: str = "parameters") -> None:
        self.make_id = make_id
        self.key = key  # of each call's arguments
        self.text = ""  # everything fed: the answer, if it is not calls
        self.buffer = ""  # fed and not yet read
        self.opened = False  # the array's "[" was read
        self.expect_item = True  # after "[" or ","
        self.call: ObjectCall | None = None
        self.calls = 0
        self.over = False
        self.as_text = False  # it was not calls: the rest is text too

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        if self.as_text:
            return [TextDelta(text)] if text else []
        if self.over:
            return out
        self.text += text
        self.buffer += text
        while self.buffer and not self.over:
            if self.call is not None:
                call, pending, self.buffer = self.call, self.buffer, ""
                out += call.feed(pending)
                if call.failed:
                    return self._fail(out)
                if not call.finished:
                    break
                self.calls += 1
                self.call, self.buffer = None, call.rest
                if not call.complete:
                    self.over = True
                continue
            stripped = self.buffer.lstrip()
            if not stripped:
                self.buffer = ""
                break
            c = stripped[0]
            if not self.opened and c == "[":
                self.opened, self.buffer = True, stripped[1:]
            elif self.opened and self.expect_item and c == "{":
                self.expect_item = False
                self.call, self.buffer = (
                    ObjectCall(self.calls, self.make_id, (self.key,)),
                    stripped,
                )
            elif self.opened and not self.expect_item and c == ",":
                self.expect_item, self.buffer = True, stripped[1:]
            elif self.opened and not self.expect_item and c == "]":
                self.over = True
            else:
                return self._fail(out)
        return out

    def _fail(self, out: list[Event]) -> list[Event]:
        self.over = True
        if not self.calls and (self.call is None or not self.call.started):
            self.as_text = True
            out.append(TextDelta(self.text))
        return out

    def finish(self) -> list[Event]:
        if self.over:
            return []
        self.over = True
        out: list[Event] = []
        if self.call is not None:
            out += self.call.close()
        if not self.calls and (self.call is None or not self.call.started) and self.text:
            out.append(TextDelta(self.text))
        return out

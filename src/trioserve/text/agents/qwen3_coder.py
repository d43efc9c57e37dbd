"""``qwen3_coder`` (Qwen3-Coder, Qwen 3.5's XML calls; vLLM's ``qwen3_xml`` too)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

As vLLM's ``Qwen3Parser``: the arguments are the parameters as a JSON object, each value
stripped of one leading and one trailing newline and given the type the tool's schema
says (``coerce_to_schema_type``: a string stays one, ``5`` for an integer, JSON for an
object...). The call starts once its name is read; a string parameter streams as the
model writes it, any other when it is whole (its type known only then).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from .calls import held_marker
from .events import Event, TextDelta, ToolCallArguments, ToolCallEnd, ToolCallStart
from .stepping import SteppedParser

TOOL_START = "<tool_call>"
TOOL_END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"
#: The longest name of a function or parameter read before the text counts as no call.
MAX_NAME = 256

_CONTENT, _PREAMBLE, _NAME, _ARGS, _KEY, _VALUE, _BETWEEN = range(7)


def schema_types(schema: Any) -> set[str]:
    """The JSON types a parameter's schema allows (vLLM's ``extract_types_from_schema``)."""
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        types.add(kind)
    elif isinstance(kind, list):
        types.update(t for t in kind if isinstance(t, str))
    for value in schema.get("enum") or []:
        types.add(
            "null"
            if value is None
            else "boolean"
            if isinstance(value, bool)
            else "integer"
            if isinstance(value, int)
            else "number"
            if isinstance(value, float)
            else "array"
            if isinstance(value, list)
            else "object"
            if isinstance(value, dict)
            else "string"
        )
    for field in ("anyOf", "oneOf", "allOf"):
        for choice in schema.get(field) or []:
            types |= schema_types(choice)
    return types or {"string"}


def coerce(value: str, types: set[str]) -> Any:
    """``value`` as the first of ``types`` it reads as (vLLM's ``coerce_to_schema_type``)."""
    for kind in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if kind not in types:
            continue
        if kind == "null" and value.lower() == "null":
            return None
        if kind == "string":
            return value
        if kind == "integer":
            try:
                return int(value)
            except ValueError:
                continue
        if kind == "number":
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if number == int(number) else number
        if kind == "boolean" and value.lower().strip() in ("true", "1", "false", "0"):
            return value.lower().strip() in ("true", "1")
        if kind in ("object", "array"):
            try:
                return json.loads(value)
            except ValueError:
                continue
    try:
        return json.loads(value)
    except ValueError:
        return value


class Qwen3CoderToolParser(SteppedParser):
    def __init__(self, make_id: Callable[[], str], tools: list[dict[str, Any]] | None = None):
        self.make_id = make_id
        self.properties: dict[str, dict[str, Any]] = {}
        for tool in tools or []:
            function = tool.get("function") or {}
            params = function.get("parameters") or {}
            self.properties[function.get("name", "")] = params.get("properties") or {}
        self.state = _CONTENT
        self.buffer = ""
        self.held = ""  # a call's text until its name is read
        self.calls = 0
        self.index = -1
        self.name = ""
        self.params = 0  # parameters of the current call so far
        self.key = ""
        self.types: set[str] = {"string"}
        self.value = ""  # a value not yet sent (any but a string's), or a held newline
        self.value_started = False
        self.opened = False  # a string value's opening quote was sent

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self.state == _CONTENT:
            self._content(self.buffer, out)
        elif self.state in (_PREAMBLE, _NAME):
            self._content(self.held + self.buffer, out)  # no call was started
        elif self.state in (_ARGS, _KEY, _VALUE):
            out.append(ToolCallEnd(self.index, False))
        self.buffer, self.held, self.state = "", "", _CONTENT
        return out

    def _content(self, text: str, out: list[Event]) -> None:
        if text and not self.calls:
            out.append(TextDelta(text))

    def _arguments(self, text: str, out: list[Event]) -> None:
        out.append(ToolCallArguments(self.index, text))

    def _until(self, markers: tuple[str, ...]) -> tuple[int, str] | None:
        found = [(at, m) for m in markers if (at := self.buffer.find(m)) >= 0]
        return min(found) if found else None

    def _keep_partial(self, markers: tuple[str, ...]) -> int:
        return max(held_marker(self.buffer, m) for m in markers)

    def _step(self, out: list[Event]) -> None:
        buffer = self.buffer
        if self.state in (_CONTENT, _BETWEEN):
            markers = (TOOL_START, FUNCTION) if self.state == _CONTENT else (
                TOOL_START, FUNCTION, TOOL_END
            )  # fmt: skip
            found = self._until(markers)
            if found is None:
                keep = self._keep_partial(markers)
                if self.state == _CONTENT:
                    self._content(buffer[: len(buffer) - keep], out)
                self.buffer = buffer[len(buffer) - keep :]
                return
            at, marker = found
            if self.state == _CONTENT:
                self._content(buffer[:at], out)
            rest = buffer[at + len(marker) :]
            if marker == TOOL_START:
                self.held, self.buffer, self.state = marker, rest, _PREAMBLE
            elif marker == FUNCTION:
                self.held, self.buffer, self.state = marker, rest, _NAME
            else:
                self.buffer, self.state = rest, _CONTENT
        elif self.state == _PREAMBLE:
            found = self._until((FUNCTION, TOOL_END))
            if found is None:
                keep = self._keep_partial((FUNCTION, TOOL_END))
                if len(buffer) - keep > MAX_NAME:
                    return self._not_a_call(out)
                self.held += buffer[: len(buffer) - keep]
                self.buffer = buffer[len(buffer) - keep :]
                return
            at, marker = found
            if marker == TOOL_END:  # a <tool_call> with no function in it: no call
                self.buffer = buffer
                return self._not_a_call(out)
            self.held += buffer[: at + len(marker)]
            self.buffer, self.state = buffer[at + len(marker) :], _NAME
        elif self.state == _NAME:
            at = buffer.find(">")
            if at < 0 or at > MAX_NAME or "\n" in buffer[:at]:
                if at < 0 and len(buffer) <= MAX_NAME and "\n" not in buffer:
                    return  # the name goes on
                return self._not_a_call(out)
            self.name, self.buffer = buffer[:at].strip(), buffer[at + 1 :]
            self.index, self.params, self.held = self.calls, 0, ""
            self.calls += 1
            out.append(ToolCallStart(self.index, self.make_id(), self.name))
            self.state = _ARGS
        elif self.state == _ARGS:
            found = self._until((PARAMETER, FUNCTION_END))
            if found is None:
                self.buffer = buffer[len(buffer) - self._keep_partial((PARAMETER, FUNCTION_END)) :]
                return
            at, marker = found
            self.buffer = buffer[at + len(marker) :]
            if marker == PARAMETER:
                self.state = _KEY
            else:
                self._arguments("}" if self.params else "{}", out)
                out.append(ToolCallEnd(self.index, True))
                self.state = _BETWEEN
        elif self.state == _KEY:
            at = buffer.find(">")
            if at < 0:
                return
            self.key, self.buffer = buffer[:at].strip(), buffer[at + 1 :]
            schema = self.properties.get(self.name, {}).get(self.key)
            self.types = schema_types(schema) if schema is not None else {"string"}
            head = "{" if not self.params else ", "
            self._arguments(head + json.dumps(self.key, ensure_ascii=False) + ": ", out)
            self.params += 1
            self.value, self.value_started = "", False
            self.state = _VALUE
        else:  # _VALUE
            self._value(out)

    def _value(self, out: list[Event]) -> None:
        buffer = self.buffer
        markers = (PARAMETER_END, PARAMETER, FUNCTION_END)
        found = self._until(markers)
        if found is None:
            keep = self._keep_partial(markers)
            piece, self.buffer = buffer[: len(buffer) - keep], buffer[len(buffer) - keep :]
            self._value_piece(piece, out, final=False)
            return
        at, marker = found
        self._value_piece(buffer[:at], out, final=True)
        # A parameter ends at its closing tag, or at the next one's start (vLLM's regex).
        self.buffer = buffer[at + len(PARAMETER_END) :] if marker == PARAMETER_END else buffer[at:]
        self.state = _ARGS

    def _value_piece(self, piece: str, out: list[Event], final: bool) -> None:
        text = self.value + piece
        if not self.value_started and text:
            if text.startswith("\n"):
                text = text[1:]
            self.value_started = True
        if self.types != {"string"}:  # its type is known when it is whole
            if not final:
                self.value = text
                return
            if text.endswith("\n"):
                text = text[:-1]
            self._arguments(json.dumps(coerce(text, self.types), ensure_ascii=False), out)
            return
        # A string streams: all but a trailing newline (the last one is the markup's).
        held = "\n" if text.endswith("\n") and not final else ""
        if final and text.endswith("\n"):
            text = text[:-1]
        send = text[: len(text) - len(held)]
        self.value = held
        opening = "" if self.opened else '"'
        self.opened = not final
        encoded = json.dumps(send, ensure_ascii=False)[1:-1]
        closing = '"' if final else ""
        if opening or encoded or closing:
            self._arguments(opening + encoded + closing, out)

    def _not_a_call(self, out: list[Event]) -> None:
        self._content(self.held + self.buffer, out)
        self.held, self.buffer, self.state = "", "", _CONTENT

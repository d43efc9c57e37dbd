"""The formats, by the names vLLM gives them (``--tool-call-parser``,
``--reasoning-parser``).

To add one: write a class with ``feed(text) -> list[Event]`` and ``finish() ->
list[Event]`` (``events.py``; it must give the same events, once joined, however the
text is cut: ``tests/text/agents/test_chunking.py`` runs every format registered here),
register it below under vLLM's name, and add its corpus to
``tests/vllm/test_parser_parity.py`` so it is held to vLLM's class of that name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .events import Event
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser, mistral_call_id
from .qwen3_coder import Qwen3CoderToolParser
from .reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser, ThinkingParser


class StreamParser(Protocol):
    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


#: Tool-call formats: each builds a parser from the way it makes call ids and the
#: request's tools (whose schemas some formats read).
TOOL_CALL_PARSERS: dict[
    str, Callable[[Callable[[], str], list[dict[str, Any]] | None], StreamParser]
] = {
    "hermes": HermesToolParser,
    # vLLM aliases qwen3_json to hermes (Qwen 2.5/QwQ/Qwen3's JSON calls).
    "qwen3_json": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "qwen3_xml": Qwen3CoderToolParser,
}

#: Reasoning formats: each builds a parser from whether the template was asked to think.
REASONING_PARSERS: dict[str, Callable[[bool], ThinkingParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}

#: How a format's calls are named, where not as vLLM names most (``events.tool_call_id``).
TOOL_CALL_IDS: dict[str, Callable[[], str]] = {"mistral": mistral_call_id}

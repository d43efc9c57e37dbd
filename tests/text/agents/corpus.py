"""Model outputs for each format: one call, several, none, malformed, unicode in the
arguments, a call after reasoning, a call cut off. Shared by the chunking tests and the
parity tests against vLLM's own parser classes (tests/vllm/test_parser_parity.py)."""

from __future__ import annotations

from trioserve.text.agents import ParserNames, ToolUse

HERMES = [
    "The weather in Paris is sunny.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"unit": "celsius"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>',
    '<tool_call>\n{"name": "translate", "arguments": {"text": "naïve café 日本語 🙂", '
    '"escaped": "a \\"quote\\" and \\\\ \\u00e9"}}\n</tool_call>',
    '<tool_call>\n{"name": "nested", "arguments": {"a": [1, -2.5e3, true, false, null], '
    '"b": {"c": {"d": []}}}}\n</tool_call>',
    "<tool_call>\nthis is not json\n</tool_call>",
    'An example: <tool_ is not a tag, and "<tool" neither.',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
    '<tool_call>\n{"name": "get_wea',
    '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>',
    '<tool_call>\n{"name": "no_arguments"}\n</tool_call>',
    '<tool_call>{"name":"compact","arguments":{"x":1}}</tool_call>',
    # Whitespace a constrained model writes (JSON allows it), and a call cut off in it:
    # streamed, the partial arguments' trailing whitespace waits for what follows.
    '<tool_call>{"name": "get_weather", "arguments": {"city"    :  "Oslo"  }  }</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city"      ',
]

THINKING = [
    "Let me think about it.</think>The answer is 4.",
    "<think>Let me think.</think>\n\nThe answer is 4.",
    "Thinking without an end",
    "</think>Just the answer.",
    "reason with <thin and </thi partial markers</think>answer with </think> again",
]

QWEN3_WITH_CALLS = [
    "I should call the tool.</think>\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    'Straight to a call <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
]

LLAMA = [
    "The weather in Paris is sunny.",
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}',
    '{"name": "translate", "parameters": {"text": "naïve café 日本語 🙂"}}',
    '{"answer": 42, "note": "a JSON answer, not a call"}',
    '{"name": "get_weather", "parameters": {"city": "Par',
    '{"name": "get_weather", "parameters": {"city": "Paris"}} and some text after',
]

QWEN3_CODER = [
    "The weather in Paris is sunny.",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>",
    "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
    '<tool_call>\n<function=translate>\n<parameter=text>\nnaïve "café"\n日本語 🙂\n'
    "</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n"
    '<parameter=options>\n{"unit": "celsius"}\n</parameter>\n</function>\n</tool_call>',
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    "<tool_call>\nno function here\n</tool_call>",
]

MISTRAL = [
    "The weather in Paris is sunny.",
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}',
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
    '[TOOL_CALLS]translate[ARGS]{"text": "naïve café 日本語 🙂"}',
    '[TOOL_CALLS]get_weather{"city": "Oslo"}',
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
]

CORPUS: dict[ParserNames, list[str]] = {
    ParserNames("hermes"): HERMES,
    ParserNames("qwen3_json"): HERMES[:3],
    ParserNames("llama3_json"): LLAMA,
    ParserNames("llama4_json"): LLAMA[:2],
    ParserNames("mistral"): MISTRAL,
    ParserNames("qwen3_coder"): QWEN3_CODER,
    ParserNames("qwen3_xml"): QWEN3_CODER[:2],
    ParserNames(None, "deepseek_r1"): THINKING,
    ParserNames(None, "qwen3"): THINKING,
    ParserNames("hermes", "qwen3"): QWEN3_WITH_CALLS + THINKING,
    ParserNames("hermes", "deepseek_r1"): QWEN3_WITH_CALLS,
}

#: The tools the corpus's calls are of (qwen3_coder reads their schemas: days is a number).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "options": {"type": "object"},
                },
            },
        },
    }
    for name in ("get_weather", "get_time", "translate", "nested", "no_arguments", "compact", "f")
]
_TOOLS = TOOLS[:1]
FORCED = [
    (ParserNames(), ToolUse(_TOOLS, "required"), text)
    for text in [
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}]',
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}]',
        "I will not call anything.",
        '[{"name": "get_weather", "parameters": {"city": "Pa',
    ]
] + [
    (ParserNames(), ToolUse(_TOOLS, "get_weather", named="get_weather"), text)
    for text in ['{"city": "Paris"}', '  {"city": "日本"}', "no object", '{"city": ']
]

_NAMED = ToolUse(_TOOLS, "get_weather", named="get_weather")
#: Forced calls of a format whose vLLM parser reads them in the format's own syntax (the
#: structural tag, or Mistral's array, holds the model to it): read as ``auto`` reads them.
NATIVE_FORCED = [
    (ParserNames(name), use, text)
    for name, texts in {
        "hermes": [HERMES[1], HERMES[3], "I will not call anything."],
        "llama3_json": [LLAMA[1], 'Sure. {"name": "get_weather", "parameters": {"city": "Oslo"}}'],
        "qwen3_coder": [QWEN3_CODER[1], QWEN3_CODER[3]],
        "mistral": ['[{"name": "get_weather", "arguments": {"city": "Paris"}}]'],
    }.items()
    for text in texts
    for use in (ToolUse(TOOLS, "required"), _NAMED)
]

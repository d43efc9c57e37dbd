"""trioserve's parsers (text/agents) held to vLLM's own on the same model outputs.

Every case of the corpus (tests/text/agents/corpus.py: one call, several, none,
malformed, unicode in the arguments, a call after reasoning, a call cut off) goes to
vLLM's serving-layer parser (``ParserManager.get_parser``, run by the vLLM interpreter in
``parser_reference.py``), whole (as vLLM answers JSON) and one token at a time (as it
streams), and to trioserve's, whole and one character at a time (its result does not
depend on the cut: tests/text/agents/test_chunking.py). The answers must agree: the
reasoning, the content, and each call's name and arguments (as JSON values: trioserve
streams the arguments as the model wrote them, vLLM re-serializes the JSON answer's).

Where vLLM's own two answers disagree with each other, or where trioserve answers
otherwise on purpose, the case is in :data:`DIFFERENCES` with the reason, and the test
holds it to that difference (it fails when the difference goes away, so the list stays
true).
"""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.vllm_session import HOW_TO_RUN, vllm_env, vllm_python
from tests.text.agents.corpus import CORPUS, FORCED, NATIVE_FORCED, TOOLS
from trioserve.http.writers.openai import parsed_message
from trioserve.text.agents import Answer, ParserNames, ToolUse, output_parser

REFERENCE = Path(__file__).with_name("parser_reference.py")

CASES: list[tuple[ParserNames, ToolUse | None, str]] = (
    [
        (names, ToolUse(TOOLS, "auto") if names.tool_call else None, text)
        for names, texts in CORPUS.items()
        for text in texts
    ]
    + FORCED
    + NATIVE_FORCED
)

#: A forced call without a tool-call format takes vLLM's generic path (a JSON array, or the
#: arguments object); vLLM serves forced calls only with a parser, and hermes takes that
#: path with its structural tags off, so the reference reads FORCED with them off. A
#: forced call of a format (NATIVE_FORCED) is read with vLLM's defaults: in the format's
#: own syntax, as ``auto`` (text/agents/structural_tags.py).
GENERIC_ENV = {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"}


def reference_env(names: ParserNames, use: ToolUse | None) -> dict[str, str]:
    return GENERIC_ENV if names.tool_call is None and use is not None else {}


_LOST_IN_VLLMS_STREAM = (
    "streamed",
    "vLLM's hermes stream drops a <tool_call> that is not a call (its JSON answer gives it "
    "as content, as trioserve does in both)",
)
_THINK_END_IN_ANSWER = (
    "streamed",
    "vLLM's qwen3 keeps a second </think> in a stream and drops it in a JSON answer; "
    "trioserve drops it in both",
)

_NOT_UNDER_THE_GRAMMAR = (
    "whole streamed",
    "a forced call's text the engine's structured outputs would not let through (an "
    "engine that constrains nothing, as the mock, can write it): vLLM answers no content, "
    "or a call of the text; trioserve answers the text",
)

#: (format, text) -> which of vLLM's answers ("whole", "streamed") trioserve's differs
#: from, and why.
DIFFERENCES: dict[tuple[str, str], tuple[str, str]] = {
    ("hermes+None:auto", "<tool_call>\nthis is not json\n</tool_call>"): _LOST_IN_VLLMS_STREAM,
    ("hermes+None:auto", '<tool_call>\n{"name": "get_wea'): _LOST_IN_VLLMS_STREAM,
    ("hermes+None:auto", '<tool_call>\n{"name": "no_arguments"}\n</tool_call>'): (
        "streamed",
        "vLLM's stream sends a call without arguments its JSON answer does not make (it "
        "answers the text); trioserve answers the text in both",
    ),
    (
        "hermes+None:auto",
        '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>',
    ): (
        "streamed",
        "vLLM's stream sends the text after the arguments as arguments when the name comes "
        "last; trioserve holds them until the name, then sends them",
    ),
    (
        "None+qwen3:none",
        "reason with <thin and </thi partial markers</think>answer with </think> again",
    ): _THINK_END_IN_ANSWER,
    (
        "hermes+qwen3:auto",
        "reason with <thin and </thi partial markers</think>answer with </think> again",
    ): _THINK_END_IN_ANSWER,
    ("llama3_json+None:auto", '{"answer": 42, "note": "a JSON answer, not a call"}'): (
        "streamed",
        "vLLM's llama3_json stream drops a JSON object that is not a call (its JSON answer "
        "gives it as content, as trioserve does in both)",
    ),
    ("llama3_json+None:auto", '{"name": "get_weather", "parameters": {"city": "Par'): (
        "streamed",
        'vLLM\'s llama3_json stream closes the JSON of a call cut off ({"city": "Par"}), '
        "which the model never wrote; trioserve streams what it wrote",
    ),
    (
        "qwen3_coder+None:auto",
        "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    ): (
        "whole",
        "vLLM's qwen3 JSON answer strips the newline before a call from the content, its "
        "stream does not; trioserve keeps it in both",
    ),
    ("qwen3_coder+None:auto", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"): (
        "whole",
        "vLLM's JSON answer makes a call with no arguments of a call cut off; trioserve "
        "answers the text (as for any call broken off)",
    ),
    ("qwen3_coder+None:auto", "<tool_call>\nno function here\n</tool_call>"): (
        "whole streamed",
        "vLLM drops a <tool_call> that holds no function; trioserve answers it as text",
    ),
    (
        "mistral+None:auto",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    ): (
        "whole streamed",
        "vLLM picks the form by the tokenizer: with a v11 one (the reference's has [ARGS]) it "
        "reads '[' as a function's name; trioserve sees only text and reads the earlier "
        "tokenizers' array, as vLLM does with those",
    ),
    ("mistral+None:auto", '[TOOL_CALLS]get_weather[ARGS]{"city": "Par'): (
        "whole",
        "vLLM's JSON answer calls with the arguments cut off; trioserve answers the text "
        "(as for any call broken off)",
    ),
    ("None+None:required", "I will not call anything."): _NOT_UNDER_THE_GRAMMAR,
    ("None+None:required", '[{"name": "get_weather", "parameters": {"city": "Pa'): (
        "whole",
        "a forced array cut off: vLLM's JSON answer has no content, trioserve's the text "
        "(as for any call broken off)",
    ),
    ("None+None:get_weather", "no object"): _NOT_UNDER_THE_GRAMMAR,
    ("None+None:get_weather", '{"city": '): (
        "whole",
        "a named call's arguments cut off: vLLM's JSON answer calls with them, trioserve's "
        "answers the text (as for any call broken off)",
    ),
    **{
        (
            f"llama3_json+None:{choice}",
            'Sure. {"name": "get_weather", "parameters": {"city": "Oslo"}}',
        ): (
            "whole",
            "vLLM's llama JSON answer finds a call after text (its structural tag lets the "
            "model write text first); its stream, and trioserve in both, answer the text",
        )
        for choice in ("required", "get_weather")
    },
    **{
        (f"mistral+None:{choice}", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'): (
            "whole streamed",
            "vLLM forces a Mistral call (Hugging Face tokenizer) into this array and then "
            "answers it as text (its parser looks for [TOOL_CALLS]); trioserve reads the "
            "array it forced as the call",
        )
        for choice in ("required", "get_weather")
    },
}


def case_key(names: ParserNames, use: ToolUse | None) -> str:
    choice = use.named or use.choice if use else "none"
    return f"{names.tool_call}+{names.reasoning}:{choice}"


def reference_case(names: ParserNames, use: ToolUse | None, text: str) -> dict[str, Any]:
    case: dict[str, Any] = {"text": text}
    if names.tool_call:
        case["tool_parser"] = names.tool_call
    elif use is not None:
        # vLLM serves forced calls only with a tool-call parser; hermes parses them as
        # every parser that "supports_required_and_named" does (the generic JSON path).
        case["tool_parser"] = "hermes"
    if names.reasoning:
        case["reasoning_parser"] = names.reasoning
    if use is not None:
        case["tools"] = TOOLS if use.choice == "auto" else use.tools
        case["tool_choice"] = (
            {"type": "function", "function": {"name": use.named}} if use.named else use.choice
        )
    return case


@pytest.fixture(scope="module")
def vllm_answers() -> list[dict[str, Any]]:
    python = vllm_python()
    if python is None:
        pytest.skip(HOW_TO_RUN)
    return reference_answers(python)


def reference_answers(python: str) -> list[dict[str, Any]]:
    """vLLM's answer to every case, each read with its environment (one run each)."""
    answers: list[dict[str, Any]] = [{} for _ in CASES]
    for env in (GENERIC_ENV, {}):
        indices = [i for i, (n, u, _) in enumerate(CASES) if reference_env(n, u) == env]
        result = subprocess.run(
            [python, str(REFERENCE)],
            input=json.dumps([reference_case(*CASES[i]) for i in indices]),
            capture_output=True,
            text=True,
            env={**vllm_env(), **env},
            timeout=600,
            check=True,
        )
        for i, answer in zip(indices, json.loads(result.stdout), strict=True):
            answers[i] = answer
    return answers


def ours(names: ParserNames, use: ToolUse | None, text: str) -> tuple[dict, dict]:
    """trioserve's JSON answer, and its stream (one character at a time) added up."""
    ids = itertools.count()

    def parser():
        made = output_parser(names, use, make_id=lambda: f"call-{next(ids)}")
        assert made is not None
        return made

    message, _ = parsed_message(parser(), text)
    whole = {
        "reasoning": message.get("reasoning"),
        "content": message["content"],
        "calls": [c["function"] for c in message.get("tool_calls", [])],
    }
    streaming, answer = parser(), Answer()
    for char in text:
        answer.add(streaming.feed(char))
    answer.add(streaming.finish())
    streamed = {
        "reasoning": answer.thinking,
        "content": answer.text,
        "calls": [{"name": c.name, "arguments": c.arguments} for c in answer.calls],
    }
    return whole, streamed


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """What a client reads of an answer: an empty field is no field, arguments are JSON."""

    def arguments(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            return text  # a call broken off: its text as it is

    return {
        "reasoning": answer["reasoning"] or None,
        "content": answer["content"] or None,
        "calls": [(c["name"], arguments(c["arguments"])) for c in answer["calls"]],
    }


@pytest.mark.parametrize(("index", "case"), list(enumerate(CASES)), ids=repr)
def test_trioserve_answers_as_vllm_does(vllm_answers, index, case):
    names, use, text = case
    reference = vllm_answers[index]
    whole, streamed = ours(names, use, text)
    ours_by = {"whole": comparable(whole), "streamed": comparable(streamed)}
    vllm_by = {k: comparable(v) if "error" not in v else v for k, v in reference.items()}
    expected_differences = DIFFERENCES.get((case_key(names, use), text))
    for how in ("whole", "streamed"):
        differs = expected_differences is not None and how in expected_differences[0]
        if differs:
            assert ours_by[how] != vllm_by[how], f"{how}: no longer differs; update DIFFERENCES"
        else:
            assert ours_by[how] == vllm_by[how], how


if __name__ == "__main__":  # print the comparison of every case (to write DIFFERENCES)
    import sys

    python = sys.argv[1]
    for case, reference in zip(CASES, reference_answers(python), strict=True):
        whole, streamed = ours(*case)
        for how, mine in (("whole", whole), ("streamed", streamed)):
            theirs = reference[how]
            theirs = comparable(theirs) if "error" not in theirs else theirs
            if comparable(mine) != theirs:
                print(case_key(case[0], case[1]), how, repr(case[2]))
                print("   ours ", comparable(mine))
                print("   vllm ", theirs)

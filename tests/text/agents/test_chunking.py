"""Every format's result does not depend on how the text is cut: one character at a
time, any random cuts (hypothesis), or the whole text at once."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioserve.text.agents import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ParserNames,
    ToolUse,
    joined,
    output_parser,
)

from .corpus import CORPUS, FORCED, NATIVE_FORCED, TOOLS


def run(names: ParserNames, use: ToolUse | None, pieces: list[str], **kwargs):
    ids = itertools.count()
    parser = output_parser(names, use, make_id=lambda: f"call-{next(ids)}", **kwargs)
    assert parser is not None
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.finish()
    return joined(events), parser.finish_reason("stop")


def cut(text: str, points: list[int]) -> list[str]:
    points = sorted({p % (len(text) + 1) for p in points})
    edges = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(edges)]


CASES = (
    [
        (names, use, text)
        for names, texts in CORPUS.items()
        for text in texts
        for use in [ToolUse(TOOLS, "auto")]
    ]
    + FORCED
    + NATIVE_FORCED
)


@pytest.mark.parametrize(("names", "use", "text"), CASES)
def test_one_character_at_a_time_is_the_whole_text(names, use, text):
    assert run(names, use, list(text)) == run(names, use, [text])


@settings(max_examples=25, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize(("names", "use", "text"), CASES)
def test_random_cuts_are_the_whole_text(names, use, text, data):
    points = data.draw(st.lists(st.integers(min_value=0, max_value=len(text)), max_size=12))
    assert run(names, use, cut(text, points)) == run(names, use, [text])


def test_every_registered_format_has_a_corpus():
    covered_tools = {n.tool_call for n in CORPUS}
    covered_reasoning = {n.reasoning for n in CORPUS}
    assert set(TOOL_CALL_PARSERS) <= covered_tools
    assert set(REASONING_PARSERS) <= covered_reasoning


def test_qwen3_coder_gives_each_parameter_its_schemas_type():
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=options>\n"
        '{"unit": "celsius"}\n</parameter>\n</function>\n</tool_call>'
    )
    events, reason = run(ParserNames("qwen3_coder"), ToolUse(TOOLS, "auto"), list(text))
    arguments = "".join(e.text for e in events if type(e).__name__ == "ToolCallArguments")
    import json

    assert json.loads(arguments) == {"city": "Oslo", "days": 3, "options": {"unit": "celsius"}}
    assert reason == "tool_calls"
    # The string streamed as it came: several argument deltas before the call's end.
    assert sum(type(e).__name__ == "ToolCallArguments" for e in events) >= 1

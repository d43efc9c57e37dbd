"""The mock engine's answers: scripted (``mock_answer``), and ending ``stop`` by itself
(``answer_tokens``) so that clients waiting for a completed answer get one."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.frontends import start_engine, start_frontend
from trioserve.engine_programs.mock import DEFAULT_MAX_TOKENS, MockBackend
from trioserve.protocol import Submit
from trioserve.sdk.core import RequestError


async def steps(backend: MockBackend, **params) -> tuple[list[str], str | None]:
    request = Submit("r", "mock", "chat", {"messages": [{"role": "user", "content": "hi"}]}, params)
    texts, reason = [], None
    async for output in backend.generate(request):
        texts.append(output.data)
        reason = output.finish_reason or reason
    return texts, reason


async def test_a_scripted_answer_comes_a_few_characters_a_token_and_ends_stop():
    backend = MockBackend(allow_fault_injection=True, ttft_ms=0, tokens_per_second=0)
    texts, reason = await steps(backend, mock_answer="<tool_call>{}</tool_call>")
    assert texts == ["<too", "l_ca", "ll>{", "}</t", "ool_", "call", ">"]
    assert reason == "stop"
    texts, reason = await steps(backend, mock_answer="abcdefgh", mock_chars_per_token=3)
    assert (texts, reason) == (["abc", "def", "gh"], "stop")


async def test_max_tokens_cuts_a_scripted_answer_with_length():
    backend = MockBackend(allow_fault_injection=True, ttft_ms=0, tokens_per_second=0)
    texts, reason = await steps(backend, mock_answer="abcdefgh", max_tokens=1)
    assert (texts, reason) == (["abcd"], "length")


async def test_a_stop_string_cuts_a_scripted_answer_and_is_its_stop_reason():
    backend = MockBackend(allow_fault_injection=True, ttft_ms=0, tokens_per_second=0)
    request = Submit(
        "r", "mock", "chat", {"messages": []},
        {"mock_answer": "one. two! three.", "stop": ["!", "."]},
    )  # fmt: skip
    outputs = [output async for output in backend.generate(request)]
    assert "".join(o.data or "" for o in outputs) == "one"  # the earliest match wins
    assert (outputs[-1].finish_reason, outputs[-1].stop_reason) == ("stop", ".")
    included = {"mock_answer": "one. two!", "stop": "two", "include_stop_str_in_output": True}
    request = Submit("r", "mock", "chat", {"messages": []}, included)
    outputs = [output async for output in backend.generate(request)]
    assert "".join(o.data or "" for o in outputs) == "one. two"
    assert outputs[-1].stop_reason == "two"
    texts, _ = await steps(backend, mock_answer="no match", stop=["?"])
    assert "".join(texts) == "no match"
    with pytest.raises(RequestError, match="stop must be"):
        await steps(backend, mock_answer="x", stop=[""])


async def test_a_scripted_answer_needs_fault_injection_and_a_string():
    with pytest.raises(RequestError, match="fault-injection"):
        await steps(MockBackend(), mock_answer="x")
    backend = MockBackend(allow_fault_injection=True)
    with pytest.raises(RequestError, match="non-empty string"):
        await steps(backend, mock_answer=3)
    with pytest.raises(RequestError, match="mock_chars_per_token"):
        await steps(backend, mock_answer="x", mock_chars_per_token=0)


async def test_answer_tokens_end_answers_stop_where_max_tokens_leaves_room():
    backend = MockBackend(answer_tokens=3, ttft_ms=0, tokens_per_second=0)
    texts, reason = await steps(backend)
    assert (len(texts), reason) == (3, "stop")
    texts, reason = await steps(backend, max_tokens=2)
    assert (len(texts), reason) == (2, "length")
    plain = MockBackend(ttft_ms=0, tokens_per_second=0)
    # Without max_tokens nothing cuts the answer: it ends as a model's would.
    texts, reason = await steps(plain)
    assert (len(texts), reason) == (DEFAULT_MAX_TOKENS, "stop")
    texts, reason = await steps(plain, max_tokens=40)
    assert (len(texts), reason) == (40, "length")  # what the client asked for, and cut


async def test_the_openai_sdks_responses_stream_completes_on_the_default_mock(nursery):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server="builtin")
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
    async with client.responses.stream(model="mock", input="hello there") as stream:
        final = await stream.get_final_response()
    assert final.status == "completed"
    assert len(final.output_text.split()) == DEFAULT_MAX_TOKENS
    await client.close()

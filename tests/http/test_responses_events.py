"""ResponseEvents (http/writers/responses.py) without a server: the typed events, their
numbering, the Response object, and that the official client's own types accept them."""

from __future__ import annotations

import json
import typing

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from tests.helpers.responses import ECHO
from trioserve.http.errors import EngineItemError, HTTPError
from trioserve.http.writers.response_events import ResponseEvents
from trioserve.http.writers.response_items import sse
from trioserve.protocol import ErrorInfo, OutputItem, Usage
from trioserve.text.agents import ParserNames, ToolUse, output_parser

#: The openai package's class of each event type.
EVENT_TYPES = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def item(seq: int, data: str | None = None, **fields) -> OutputItem:
    return OutputItem("r", seq, data=data, **fields)


def validated(events) -> list:
    """Each event checked against the openai package's own types (strictly, where the
    client itself does not check). trioserve's error codes are its own (docs/api.md),
    so a failed response's code is swapped for one of OpenAI's to check the rest."""
    out = []
    for name, data in events:
        event = json.loads(data)
        assert event["type"] == name
        if event.get("response", {}).get("error"):
            event["response"]["error"]["code"] = "server_error"
        out.append(EVENT_TYPES[name].model_validate(event, strict=True))
    return out


def test_a_streamed_response_from_first_delta_to_completion():
    events = ResponseEvents("resp_1", "mock", ECHO)
    first, done, failure = events.take([item(0, " a"), item(1, " b")])
    assert not done and failure is None
    rest, done, _ = events.take([item(2, " c"), item(3, finish_reason="stop", usage=Usage(2, 3))])
    assert done
    typed = validated(first + rest)
    assert [e.type for e in typed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in typed] == list(range(10))
    assert [e.delta for e in typed if e.type.endswith(".delta")] == [" a b", " c"]
    final = typed[-1].response
    assert final.status == "completed" and final.output_text == " a b c"
    assert final.usage.input_tokens == 2 and final.usage.output_tokens == 3
    assert Response.model_validate(events.snapshot()) == final


def test_the_pre_encoded_delta_is_what_the_json_encoder_gives():
    events = ResponseEvents("resp_1", "mock", ECHO)
    text = 'quote " slash \\ newline \n tab \t é 漢 🎉 \x00'
    (*_, (name, data)), _, _ = events.take([item(0, text)])
    assert name == "response.output_text.delta"
    assert json.loads(data) == {
        "type": name,
        "sequence_number": 4,
        "item_id": events.message_id,
        "output_index": 0,
        "content_index": 0,
        "delta": text,
        "logprobs": [],
    }


def test_length_is_incomplete_at_max_output_tokens():
    events = ResponseEvents("resp_1", "mock", ECHO)
    out, done, _ = events.take([item(0, " a", finish_reason="length", usage=Usage(1, 1))])
    final = validated(out)[-1]
    assert done and final.type == "response.incomplete"
    assert final.response.incomplete_details.reason == "max_output_tokens"
    assert final.response.output[0].status == "incomplete"


def test_an_engine_error_comes_after_the_outputs_ahead_of_it():
    events = ResponseEvents("resp_1", "mock", ECHO)
    error = ErrorInfo(429, "busy")
    out, done, failure = events.take([item(0, " a"), item(1, error=error)])
    assert not done and isinstance(failure, EngineItemError)
    assert failure.error.status == 429
    assert [name for name, _ in out][-1] == "response.output_text.delta"
    nothing, _, failure = ResponseEvents("resp_2", "mock", ECHO).take([item(0, error=error)])
    assert nothing == [] and failure is not None  # nothing sent: the status is the answer


def test_a_failure_is_response_failed_and_a_cancel_is_cancelled():
    events = ResponseEvents("resp_1", "mock", ECHO)
    events.take([item(0, " a")])
    [failed] = validated(events.fail(HTTPError(504, "too late", "deadline_exceeded")))
    assert failed.type == "response.failed" and failed.sequence_number == 5
    assert failed.response.status == "failed"
    assert events.error == {
        "code": "deadline_exceeded",
        "message": "too late",
        "type": "timeout_error",
        "param": None,
    }
    assert failed.response.output[0].status == "incomplete"
    cancelled = ResponseEvents("resp_2", "mock", ECHO)
    created, failed_event = validated(
        cancelled.fail(HTTPError(499, "the request was cancelled", "request_cancelled"))
    )
    assert created.type == "response.created"  # nothing was sent before it
    assert failed_event.response.status == "cancelled"


def test_a_background_response_is_queued_until_its_first_output():
    events = ResponseEvents("resp_1", "mock", ECHO, background=True)
    [created] = validated(events.begin())
    assert created.response.status == "queued" and created.response.background is True
    opened = validated(events.take([item(0, " a")])[0])
    assert [e.type for e in opened] == [
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert [e.sequence_number for e in opened] == [1, 2, 3, 4]


def test_rollback_forgets_what_was_not_kept():
    events = ResponseEvents("resp_1", "mock", ECHO)
    events.take([item(0, " a")])
    mark = events.mark()
    events.take([item(1, " b"), item(2, finish_reason="stop", usage=Usage(1, 2))])
    assert events.status == "completed"
    events.rollback(mark)
    assert (events.seq, events.text, events.status) == (5, " a", "in_progress")
    assert events.usage is None and events.completed_at is None
    [(_, data)] = events.take([item(1, " b")])[0]
    assert json.loads(data)["sequence_number"] == 5


@pytest.mark.parametrize("background", [False, True])
def test_sse_names_each_event_by_its_type(background):
    events = ResponseEvents("resp_1", "mock", ECHO, background=background)
    frames = sse(events.begin()).split(b"\n\n")[:-1]
    for frame in frames:
        name, data = frame.split(b"\n")
        assert (
            name.removeprefix(b"event: ")
            == orjson.loads(data.removeprefix(b"data: "))["type"].encode()
        )


def test_rollback_forgets_calls_and_reasoning_that_were_not_kept():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    parser = output_parser(ParserNames("hermes", "qwen3"), ToolUse(tools, "auto"))
    events = ResponseEvents("resp_1", "mock", ECHO, parser=parser)
    events.take([item(0, "think</think>"), item(1, '<tool_call>{"name": "f", "arguments": {"a"')])
    assert [entry["type"] for entry in events.snapshot()["output"]] == [
        "reasoning",
        "function_call",
    ]
    mark, seq = events.mark(), events.seq
    done, finished, _ = events.take(
        [item(2, ": 1}}</tool_call>"), item(3, finish_reason="stop", usage=Usage(1, 3))]
    )
    assert finished and events.status == "completed"
    assert [name for name, _ in done][-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    events.rollback(mark)
    assert events.seq == seq and events.status == "in_progress"
    [reasoning, call] = events.snapshot()["output"]
    assert reasoning["status"] == "completed" and call["status"] == "in_progress"
    assert call["arguments"] == '{"a"'
    assert events.output_messages()[0]["tool_calls"][0]["function"]["arguments"] == '{"a"'

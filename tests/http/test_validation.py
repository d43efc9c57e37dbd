"""What a request body may make the frontend do before its answer: bounded shapes, capped
error lists, integers an engine can hold, and nothing a client sends that could pass for
what the frontend builds for the engine."""

from __future__ import annotations

import base64
import os

import orjson
import pytest
import trio

from tests.helpers.frontends import capture_submits
from trioserve.http.bodies import media
from trioserve.http.bodies.openai import MAX_CONTENT_PARTS, MAX_CONTENT_PARTS_TOTAL, MAX_MESSAGES
from trioserve.http.bodies.validation import MAX_ERRORS, MAX_JSON_COMMAS

USER = {"role": "user", "content": "hello"}


async def post_422(frontend, body: dict | bytes, route: str = "/v1/chat/completions") -> dict:
    """Post ``body``; it must be a 422 that reached no engine, and the server serves on.
    Returns the error object."""
    submits = capture_submits(frontend)
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    async with frontend.client() as client:
        async with client.stream("POST", route, content=content) as response:
            assert response.status_code == 422
            error = orjson.loads(await response.aread())["error"]
        ok = await client.post(route, json={"messages": [USER], "max_tokens": 2})
        assert ok.status_code == 200
    assert len(submits) == 1  # only the request that followed
    return error


def locs(error: dict) -> list[str]:
    return [d["loc"] for d in error["details"]]


@pytest.mark.parametrize(
    ("part", "loc"),
    [
        (
            {"type": "image", "media": {"modality": "image", "mime_type": "image/png"}},
            "$.messages[0].content[1].type",
        ),
        ({"type": "audio", "media": {"path": "/etc/shadow"}}, "$.messages[0].content[1].media"),
        ({"type": "file"}, "$.messages[0].content[1].type"),
        ({"type": "text", "text": "x", "media": {"path": "/etc/shadow"}}, None),
    ],
)
async def test_a_client_part_cannot_pass_for_a_media_record_the_server_builds(frontend, part, loc):
    # {"type": "image", "media": {"path": ...}} is what the frontend writes for an upload,
    # and engines open that path: a client's part must never look like one.
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, part]}]}
    body["messages"][0]["content"][1].setdefault("media", {}).setdefault("path", "/etc/shadow")
    error = await post_422(frontend, body)
    assert "$.messages[0].content[1].media" in locs(error)
    if loc is not None:
        assert loc in locs(error)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 2**63),
        ("max_tokens", 2**31),  # more than an engine counts
        ("max_completion_tokens", 2**63 - 1),
        ("seed", 2**63),
        ("seed", str(-(2**63) - 1)),  # (as a JSON number, orjson makes it a float)
        ("seed", "9223372036854775808"),  # a string the converter turns into a number
    ],
)
async def test_integers_an_engine_cannot_hold_are_422(frontend, field, value):
    body = b'{"messages": [{"role": "user", "content": "x"}], "stream": true, "%s": %s}' % (
        field.encode(),
        orjson.dumps(value) if isinstance(value, str) else str(value).encode(),
    )
    error = await post_422(frontend, body)
    assert locs(error) == [f"$.{field}"]


async def test_more_messages_than_the_bound_are_refused_before_anything_is_built(frontend):
    error = await post_422(frontend, {"messages": [USER] * (MAX_MESSAGES + 1)})
    assert locs(error) == ["$.messages"] and str(MAX_MESSAGES) in error["message"]


@pytest.mark.parametrize(
    "contents",
    [
        [[{"type": "text", "text": "x"}] * (MAX_CONTENT_PARTS + 1)],
        [[{"type": "text", "text": "x"}] * MAX_CONTENT_PARTS]
        * (MAX_CONTENT_PARTS_TOTAL // MAX_CONTENT_PARTS + 1),
    ],
    ids=["per-message", "per-request"],
)
async def test_more_content_parts_than_the_bounds_are_refused(frontend, contents):
    body = {"messages": [{"role": "user", "content": content} for content in contents]}
    error = await post_422(frontend, body)
    assert locs(error) == [f"$.messages[{len(contents) - 1}].content"]


async def test_the_error_list_is_capped_and_counts_the_rest(frontend):
    # A shape within the bounds, every message wrong twice, a top-level field wrong too.
    body = {"messages": [{"role": 5, "name": 5}] * 50, "max_tokens": "many"}
    error = await post_422(frontend, body)
    assert len(error["details"]) == MAX_ERRORS + 1
    assert error["details"][0] == {"loc": "$.messages[0].role", "msg": "expected a string, got int"}
    assert error["details"][-1] == {"loc": "$", "msg": "81 more error(s) not listed"}


async def test_a_body_of_more_json_values_than_the_bound_is_refused_unparsed(frontend):
    # Parsing builds one object per value on the event loop: 44 million of them in a
    # 128 MiB body took seconds. An unknown field would otherwise reach the engine.
    padding = b"[" + b",".join([b"0"] * (MAX_JSON_COMMAS + 1)) + b"]"
    body = b'{"messages": [{"role": "user", "content": "x"}], "pad": %s}' % padding
    error = await post_422(frontend, body)
    assert locs(error) == ["$"] and "JSON values" in error["message"]


async def test_a_large_base64_payload_is_decoded_in_steps_that_let_others_run(monkeypatch):
    monkeypatch.setattr(media, "DECODE_STEP", 1024)
    raw = os.urandom(48 * 1024 + 5)
    text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    text = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    ticks = 0
    done = False

    async def other() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        decoded = await media.decode_base64(text)
        done = True
    assert decoded == raw
    assert ticks > 10

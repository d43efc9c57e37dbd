"""trioserve in front of vLLM answers exactly what vLLM's own server answers.

The same tiny model and options on both sides (``conftest.py``); each case is sent to the
session's vLLM API server and, through a trioserve frontend, to the session's vLLM engine,
and what a client reads is compared: the text (decoded by vLLM: byte-level BPE tokens that
split a character are joined), ``finish_reason`` and ``usage``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from tests.helpers.vllm import (
    CHAT,
    COMPLETIONS,
    DETAIL_CASES,
    REFUSED_AT_THE_DOOR,
    chat,
    client,
    completion,
    details_as_vllm_serves_them,
    essentials,
    frontend_on,
    post_json,
    stream_essentials,
    stream_logprobs,
    websocket_chunks,
)
from tests.helpers.vllm_session import MODEL, Vllm

pytestmark = pytest.mark.integration

#: Greedy and sampled requests, each parameter of the mapping exercised at least once.
CASES = [
    (CHAT, chat("Hello", max_tokens=24, temperature=0)),
    (CHAT, chat("Tell me a story about a robot.", max_completion_tokens=40, temperature=0)),
    (COMPLETIONS, completion("The quick brown fox", max_tokens=32, temperature=0)),
    (COMPLETIONS, completion("Grüße aus Köln", max_tokens=48, temperature=0)),
    (CHAT, chat("Sample", max_tokens=32, temperature=0.9, top_p=0.8, top_k=40, seed=7)),
    (COMPLETIONS, completion("Seeded", max_tokens=32, temperature=1.2, min_p=0.05, seed=11)),
    (
        COMPLETIONS,
        completion(
            "Penalties",
            max_tokens=40,
            temperature=0,
            presence_penalty=1.5,
            frequency_penalty=0.5,
            repetition_penalty=1.3,
        ),
    ),
    (CHAT, chat("Ignore the end", max_tokens=64, temperature=0, ignore_eos=True)),
    (CHAT, chat("Bounded", max_tokens=16, temperature=0, min_tokens=8)),
]


async def _both(vllm: Vllm, nursery: trio.Nursery, path: str, body: dict[str, Any]):
    frontend = await frontend_on(nursery, vllm)
    ours = await post_json(frontend.url, path, body)
    theirs = await post_json(vllm.reference_url, path, body)
    return ours, theirs


@pytest.mark.parametrize(("path", "body"), CASES)
async def test_json_answers_match_vllm_serve(vllm: Vllm, nursery, path, body) -> None:
    ours, theirs = await _both(vllm, nursery, path, body)
    assert theirs.status_code == 200, theirs.text
    assert ours.status_code == 200, ours.text
    assert essentials(ours.json()) == essentials(theirs.json())
    assert ours.json()["model"] == MODEL


@pytest.mark.parametrize(("path", "body"), [CASES[0], CASES[2], CASES[3], CASES[4]])
async def test_streamed_answers_match_vllm_serve(vllm: Vllm, nursery, path, body) -> None:
    frontend = await frontend_on(nursery, vllm)
    ours = await stream_essentials(frontend.url, path, body)
    theirs = await stream_essentials(vllm.reference_url, path, body)
    assert ours == theirs
    # ...and a stream says what the JSON answer says.
    whole = essentials((await post_json(frontend.url, path, body)).json())
    assert ours == whole


async def test_a_character_split_across_tokens_arrives_whole(vllm: Vllm, nursery) -> None:
    """The tokenizer is byte-level BPE: a long greedy answer of the tiny model holds
    characters whose bytes came in separate tokens; vLLM's detokenizer joins them, and a
    stream cut at token boundaries must carry the same characters."""
    frontend = await frontend_on(nursery, vllm)
    body = completion("日本語", max_tokens=400, temperature=0, ignore_eos=True)
    streamed = await stream_essentials(frontend.url, COMPLETIONS, body)
    theirs = essentials((await post_json(vllm.reference_url, COMPLETIONS, body)).json())
    assert streamed == theirs
    assert any(ord(c) > 0x7F and c != "\ufffd" for c in streamed["text"]), streamed["text"]


async def test_stop_strings_and_stop_token_ids_end_with_stop(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm)
    greedy = completion("Stop", max_tokens=40, temperature=0)
    text = (await post_json(frontend.url, COMPLETIONS, greedy)).json()["choices"][0]["text"]
    # A stop string and a stop token taken from the greedy answer, so that both occur.
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), text
    tokens = (await post_json(vllm.reference_url, "/tokenize", {"prompt": text[5:]})).json()
    for body in ({**greedy, "stop": [stop]}, {**greedy, "stop_token_ids": tokens["tokens"][:1]}):
        ours, theirs = await _both(vllm, nursery, COMPLETIONS, body)
        assert essentials(ours.json()) == essentials(theirs.json())
        assert ours.json()["choices"][0]["finish_reason"] == "stop", body
        assert ours.json()["choices"][0]["stop_reason"] is not None, body  # vLLM's, compared
    ours, _ = await _both(vllm, nursery, COMPLETIONS, {**greedy, "stop": [stop]})
    assert stop not in ours.json()["choices"][0]["text"]


async def test_websocket_streams_the_same_text(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm)
    body = chat("Hello over a socket", max_tokens=24, temperature=0)
    theirs = essentials((await post_json(vllm.reference_url, CHAT, body)).json())
    chunks, usage = await websocket_chunks(frontend.url, CHAT, body)
    text = "".join(c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"])
    assert text == theirs["text"]
    assert [usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]] == theirs[
        "usage"
    ]


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {
            "type": "json_schema",
            "json_schema": {
                "name": "point",
                "schema": {
                    "type": "object",
                    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                    "required": ["x", "y"],
                },
            },
        },
    ],
)
async def test_structured_outputs_match_vllm_serve(vllm: Vllm, nursery, response_format) -> None:
    body = chat("A point, as JSON", max_tokens=60, temperature=0, response_format=response_format)
    ours, theirs = await _both(vllm, nursery, CHAT, body)
    assert theirs.status_code == 200, theirs.text
    assert ours.status_code == 200, ours.text
    assert essentials(ours.json()) == essentials(theirs.json())


# -- what vLLM refuses ------------------------------------------------------------------------


async def test_a_prompt_longer_than_the_context_is_a_400_with_vllms_reason(vllm, nursery) -> None:
    body = completion("fox " * 5000, max_tokens=4)
    ours, theirs = await _both(vllm, nursery, COMPLETIONS, body)
    assert theirs.status_code == 400
    assert ours.status_code == 400, ours.text
    message = ours.json()["error"]["message"]
    assert "context length" in message or "maximum" in message, message
    assert "4096" in message


@pytest.mark.parametrize(
    ("param", "value"),
    [("top_k", -7), ("min_p", 3.0), ("repetition_penalty", -1.0), ("stop_token_ids", "x")],
)
async def test_a_parameter_vllm_rejects_is_a_400_naming_it(vllm, nursery, param, value) -> None:
    body = completion("Hi", max_tokens=4, **{param: value})
    ours, theirs = await _both(vllm, nursery, COMPLETIONS, body)
    assert theirs.status_code == 400, theirs.text
    assert ours.status_code == 400, ours.text
    assert param in ours.json()["error"]["message"], ours.json()
    # ...and the engine goes on serving.
    ok = await post_json(
        (await frontend_on(nursery, vllm)).url, COMPLETIONS, completion("Hi", max_tokens=2)
    )
    assert ok.status_code == 200


@pytest.mark.parametrize(("path", "body", "streamed"), DETAIL_CASES)
async def test_echo_prompt_logprobs_and_token_ids_match_vllm_serve(
    vllm: Vllm, nursery, path, body, streamed
) -> None:
    """The shared engine serves them from the same text layer as the direct path, on
    trioserve's protocol (``OutputItem.token_ids``, ``prompt_token_ids``,
    ``prompt_logprobs``): the answers are vllm serve's, as on the direct path
    (test_direct_vllm.py, the same cases)."""
    frontend = await frontend_on(nursery, vllm)
    await details_as_vllm_serves_them(frontend.url, vllm.reference_url, path, body, streamed)


@pytest.mark.parametrize(("path", "body", "says"), REFUSED_AT_THE_DOOR)
async def test_what_vllm_serve_refuses_at_its_door_is_the_same_400(
    vllm: Vllm, nursery, path, body, says
) -> None:
    """Its request and sampling checks, made in the shared engine (a 400 error item):
    no stream without the prompt logprobs it asked for."""
    ours, theirs = await _both(vllm, nursery, path, body)
    assert theirs.status_code == 400 and says in theirs.json()["error"]["message"], theirs.text
    assert ours.status_code == 400 and says in ours.json()["error"]["message"], ours.text


def _logprobs_of(answer: dict[str, Any]) -> Any:
    logprobs = answer["choices"][0]["logprobs"]
    return logprobs["content"] if logprobs and "content" in logprobs else logprobs


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, chat("Hello", max_tokens=12, temperature=0, logprobs=True)),
        (CHAT, chat("Hello", max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)),
        (COMPLETIONS, completion("日本語", max_tokens=24, temperature=0, logprobs=0)),
        (COMPLETIONS, completion("The quick", max_tokens=12, temperature=0, logprobs=2)),
    ],
)
async def test_logprobs_match_vllm_serve(vllm: Vllm, nursery, path, body) -> None:
    frontend = await frontend_on(nursery, vllm)
    ours, theirs = await _both(vllm, nursery, path, body)
    assert theirs.status_code == 200, theirs.text
    assert ours.status_code == 200, ours.text
    assert essentials(ours.json()) == essentials(theirs.json())
    expected = _logprobs_of(theirs.json())
    assert expected, theirs.json()
    assert _logprobs_of(ours.json()) == expected
    # Streamed, the chunks' log probabilities add up to the same.
    assert await stream_logprobs(frontend.url, path, body) == expected
    assert await stream_logprobs(vllm.reference_url, path, body) == expected


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, chat("Sample twice", max_tokens=16, temperature=1.0, seed=7, n=2)),
        (COMPLETIONS, completion("Three times", max_tokens=12, temperature=0.8, seed=3, n=3)),
    ],
)
async def test_n_choices_match_vllm_serve(vllm: Vllm, nursery, path, body) -> None:
    """n choices are n engine requests, choice i seeded with seed + i: vLLM's own
    parallel sampling, so the same choices as vllm serve, and usage as it counts it."""
    ours, theirs = await _both(vllm, nursery, path, body)
    assert theirs.status_code == 200, theirs.text
    assert ours.status_code == 200, ours.text

    def choices(answer: dict[str, Any]) -> list[tuple[int, str, str]]:
        return [
            (
                c["index"],
                c["message"]["content"] if "message" in c else c["text"],
                c["finish_reason"],
            )
            for c in answer["choices"]
        ]

    assert choices(ours.json()) == choices(theirs.json())
    assert len(choices(ours.json())) == body["n"]
    usage = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [ours.json()["usage"][k] for k in usage] == [theirs.json()["usage"][k] for k in usage]


async def test_greedy_n_choices_are_refused_as_vllm_serve_refuses_them(vllm: Vllm, nursery):
    body = completion("Greedy", max_tokens=8, temperature=0, n=2)
    ours, theirs = await _both(vllm, nursery, COMPLETIONS, body)
    assert theirs.status_code == ours.status_code == 400, ours.text
    assert "greedy" in ours.json()["error"]["message"]


async def test_streamed_n_choices_match_vllm_serve(vllm: Vllm, nursery) -> None:
    body = completion("Stream three", max_tokens=12, temperature=0.9, seed=5, n=3, stream=True)

    async def streamed(url: str) -> dict[int, tuple[str, str | None]]:
        texts: dict[int, str] = {}
        finishes: dict[int, str | None] = {}
        async with (
            client(url) as http,
            http.stream("POST", COMPLETIONS, json={"model": MODEL, **body}) as response,
        ):
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        i = choice["index"]
                        texts[i] = texts.get(i, "") + (choice.get("text") or "")
                        finishes[i] = choice.get("finish_reason") or finishes.get(i)
        return {i: (texts[i], finishes[i]) for i in texts}

    frontend = await frontend_on(nursery, vllm)
    ours = await streamed(frontend.url)
    assert ours == await streamed(vllm.reference_url)
    assert sorted(ours) == [0, 1, 2]

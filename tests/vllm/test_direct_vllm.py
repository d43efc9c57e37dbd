"""The direct path, ``trioserve run --vllm MODEL`` (this process is vLLM's EngineCore's
client, the text pipeline in the frontend): the same answers as ``vllm serve`` on the same
model and options, each early end's abort seen in vLLM's scheduler figures, and the engine's
death. One run of the CLI for the module (the EngineCore is its child); the death test,
last, kills it."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.helpers.enginecore_session import ANSWER_GUARD
from tests.helpers.vllm import (
    CHAT,
    COMPLETIONS,
    DETAIL_CASES,
    REFUSED_AT_THE_DOOR,
    STRICT_WEATHER_TOOLS,
    TEXT,
    chat,
    client,
    completion,
    details,
    details_as_vllm_serves_them,
    essentials,
    post_json,
    stream_details,
    stream_essentials,
    tool_answers_as_vllm_serves_them,
    websocket_chunks,
)
from tests.helpers.vllm_session import MODEL, ROOT, START_GUARD, VLLM_OPTIONS, Vllm, vllm_env
from tests.helpers.waiting import HANG_GUARD
from trioserve.http.writers.openai import merge_logprobs

pytestmark = pytest.mark.integration

CASES = [
    (CHAT, chat("Hello", max_tokens=24, temperature=0)),
    (COMPLETIONS, completion("The quick brown fox", max_tokens=32, temperature=0)),
    (COMPLETIONS, completion("Grüße aus Köln 日本語 🙂", max_tokens=48, temperature=0)),
    (CHAT, chat("Sample", max_tokens=32, temperature=0.9, top_p=0.8, top_k=40, seed=7)),
    (CHAT, chat("Ignore the end", max_tokens=64, temperature=0, ignore_eos=True)),
    (CHAT, chat("Bounded", max_tokens=16, temperature=0, min_tokens=8)),
]


class Direct:
    """The module's ``trioserve run --vllm`` (direct), and its log."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log
        self.url = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def metric(self, name: str) -> float:
        async with httpx.AsyncClient(base_url=self.url, timeout=HANG_GUARD) as http:
            text = (await http.get("/metrics")).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="module")
def direct(vllm: Vllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Direct]:
    log = tmp_path_factory.mktemp("direct") / "run.log"
    command = [vllm.python, "-m", "trioserve", "run", "--port", "0", "--vllm"]
    # vLLM's own tool options inside --vllm-args are the frontend's (they parse nothing
    # without tools: every other test here is unaffected).
    engine_args = [*VLLM_OPTIONS, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    command += [str(vllm.model_dir), "--vllm-args", shlex.join(engine_args)]
    # The hang guard of the other helpers (enginecore_session.ANSWER_GUARD): on a loaded
    # 2-core machine vLLM's engine once left the default 30 s heartbeat unanswered mid-suite,
    # which stops this module's server and fails every test after it.
    command += ["--vllm-heartbeat-timeout", str(ANSWER_GUARD)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=vllm_env(), cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
    run = Direct(process, log)
    try:
        deadline = time.monotonic() + START_GUARD
        while not (match := re.search(r"Running on (http://127\.0\.0\.1:\d+)", run.output())):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"trioserve run --vllm did not start:\n{run.output()[-4000:]}")
            time.sleep(0.5)
        run.url = match[1]
        yield run
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.mark.parametrize(("path", "body"), CASES)
async def test_json_answers_match_vllm_serve(vllm: Vllm, direct: Direct, path, body) -> None:
    ours = await post_json(direct.url, path, body)
    theirs = await post_json(vllm.reference_url, path, body)
    assert theirs.status_code == 200 and ours.status_code == 200, ours.text
    assert essentials(ours.json()) == essentials(theirs.json())


async def test_the_engines_tokens_and_queue_time_reach_the_frontends_metrics(
    direct: Direct,
) -> None:
    # EngineCore's own figures, read from its outputs: the tokens it generated (step by
    # step) and each request's queue time (its QUEUED and SCHEDULED events).
    tokens = await direct.metric("trioserve_engine_generation_tokens_total")
    queued = await direct.metric("trioserve_request_queue_time_seconds_count")
    answer = await post_json(
        direct.url, COMPLETIONS, completion("Count", max_tokens=8, temperature=0, ignore_eos=True)
    )
    assert answer.status_code == 200, answer.text
    assert await direct.metric("trioserve_engine_generation_tokens_total") == tokens + 8
    assert await direct.metric("trioserve_request_queue_time_seconds_count") == queued + 1


@pytest.mark.parametrize(("path", "body"), CASES[:3])
async def test_streamed_answers_match_vllm_serve(vllm: Vllm, direct: Direct, path, body) -> None:
    ours = await stream_essentials(direct.url, path, body)
    theirs = await stream_essentials(vllm.reference_url, path, body)
    assert ours == theirs


@pytest.mark.parametrize(("path", "body", "streamed"), DETAIL_CASES)
async def test_echo_prompt_logprobs_and_token_ids_match_vllm_serve(
    vllm: Vllm, direct: Direct, path, body, streamed
) -> None:
    await details_as_vllm_serves_them(direct.url, vllm.reference_url, path, body, streamed)


#: Logprobs (chat: logprobs and top_logprobs; completions: a count).
LOGPROB_CASES = [
    (CHAT, chat("Hello", max_tokens=12, temperature=0, logprobs=True)),
    (CHAT, chat(TEXT, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)),
    (COMPLETIONS, completion("日本語", max_tokens=24, temperature=0, logprobs=0)),
    (COMPLETIONS, completion("The quick", max_tokens=12, temperature=0, logprobs=2)),
    (
        COMPLETIONS,
        completion(
            "The quick", max_tokens=8, temperature=0, logprobs=1, return_tokens_as_token_ids=True
        ),
    ),
]


@pytest.mark.parametrize(("path", "body"), LOGPROB_CASES)
async def test_logprobs_match_vllm_serve(vllm: Vllm, direct: Direct, path, body) -> None:
    ours = await post_json(direct.url, path, body)
    theirs = await post_json(vllm.reference_url, path, body)
    assert theirs.status_code == 200 and ours.status_code == 200, ours.text
    expected = details(theirs.json())
    assert expected["choices"][0]["logprobs"], theirs.json()
    assert details(ours.json()) == expected
    ours_streamed = await stream_details(direct.url, path, body)
    assert ours_streamed == await stream_details(vllm.reference_url, path, body)


N_CASES = [
    (CHAT, chat("Sample twice", max_tokens=16, temperature=1.0, seed=7, n=2)),
    (COMPLETIONS, completion("Three times", max_tokens=12, temperature=0.8, seed=3, n=3)),
    (CHAT, chat("Two", max_tokens=6, temperature=0.9, seed=1, n=2, logprobs=True, top_logprobs=2)),
    (COMPLETIONS, completion("Two", max_tokens=6, temperature=0.9, seed=2, n=2, logprobs=1)),
]


@pytest.mark.parametrize(("path", "body"), N_CASES)
async def test_n_choices_match_vllm_serve(vllm: Vllm, direct: Direct, path, body) -> None:
    """n choices are n engine requests, choice i seeded with seed + i (vLLM's own parallel
    sampling): the same choices as vllm serve, usage as it counts it, JSON, SSE and over
    the WebSocket (the SSE route's chunks, then one done with the JSON answer's usage)."""
    ours = await post_json(direct.url, path, body)
    theirs = await post_json(vllm.reference_url, path, body)
    assert theirs.status_code == 200 and ours.status_code == 200, ours.text
    assert len(ours.json()["choices"]) == body["n"]
    assert details(ours.json()) == details(theirs.json())
    streamed = _choices(await _sse_chunks(vllm.reference_url, path, body))
    assert _choices(await _sse_chunks(direct.url, path, body)) == streamed
    chunks, usage = await websocket_chunks(direct.url, path, body)
    assert _choices(chunks) == streamed
    assert usage == {k: theirs.json()["usage"][k] for k in usage}


async def _sse_chunks(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    request = {"model": MODEL, **body, "stream": True}
    chunks = []
    async with client(url) as http, http.stream("POST", path, json=request) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks


def _choices(chunks: list[dict[str, Any]]) -> dict[int, Any]:
    """Each choice's text, finish reason and log probabilities, from its chunks."""
    texts: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    logprobs: dict[int, Any] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            i = choice["index"]
            delta = choice.get("delta", {}).get("content") or choice.get("text") or ""
            texts[i] = texts.get(i, "") + delta
            finishes[i] = choice.get("finish_reason") or finishes.get(i)
            piece = choice.get("logprobs")
            if piece is not None:
                piece = piece.get("content", piece)
                logprobs[i] = merge_logprobs(logprobs.get(i), piece)
    return {i: (texts[i], finishes[i], logprobs.get(i)) for i in texts}


async def test_greedy_n_choices_are_refused_as_vllm_serve_refuses_them(
    vllm: Vllm, direct: Direct
) -> None:
    body = completion("Greedy", max_tokens=8, temperature=0, n=2)
    ours = await post_json(direct.url, COMPLETIONS, body)
    theirs = await post_json(vllm.reference_url, COMPLETIONS, body)
    assert theirs.status_code == ours.status_code == 400, ours.text
    assert "greedy" in ours.json()["error"]["message"]


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


#: Structured outputs with vLLM's default backend, auto: xgrammar when it takes the
#: constraint, else guidance, whose refusal is a 400 (xgrammar alone would have ignored
#: uniqueItems and answered something else).
STRUCTURED_CASES = [
    {"response_format": {"type": "json_object"}},
    {"response_format": _schema({"type": "object", "properties": {"n": {"type": "integer"}}})},
    {"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    {"structured_outputs": {"regex": "[a-z]{3}[0-9]+"}},
    {"structured_outputs": {"grammar": 'root ::= "a" | "b"'}},
    {
        "response_format": _schema(
            {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
        )
    },
    {"structured_outputs": {"regex": "[a-z"}},
    {"structured_outputs": {"grammar": "root ::= ("}},
]


@pytest.mark.parametrize("constraint", STRUCTURED_CASES)
async def test_structured_outputs_match_vllm_serve(vllm: Vllm, direct: Direct, constraint) -> None:
    body = chat("Answer", max_tokens=24, seed=3, temperature=0.8, **constraint)
    ours = await post_json(direct.url, CHAT, body)
    theirs = await post_json(vllm.reference_url, CHAT, body)
    assert ours.status_code == theirs.status_code, (ours.text, theirs.text)
    if theirs.status_code == 200:
        assert essentials(ours.json()) == essentials(theirs.json())
    else:
        assert theirs.status_code == 400
        assert ours.json()["error"]["message"] == theirs.json()["error"]["message"]
    after = await post_json(direct.url, COMPLETIONS, completion("Hi", max_tokens=2))
    assert after.status_code == 200


@pytest.mark.parametrize(("priority", "status"), [(5, 200), (-3, 200), (1.5, 400), ("x", 400)])
async def test_priority_is_taken_as_vllm_serve_takes_it(
    vllm: Vllm, direct: Direct, priority, status
) -> None:
    """vLLM 0.32's FCFS scheduler (the default) accepts any priority and ignores it."""
    body = completion("Hi", max_tokens=6, temperature=0, priority=priority)
    ours = await post_json(direct.url, COMPLETIONS, body)
    theirs = await post_json(vllm.reference_url, COMPLETIONS, body)
    assert theirs.status_code == ours.status_code == status, ours.text
    if status == 200:
        assert essentials(ours.json()) == essentials(theirs.json())
    else:
        assert "priority" in ours.json()["error"]["message"]


@pytest.mark.parametrize("include", [False, True])
async def test_a_stop_string_ends_with_stop_and_one_abort(vllm: Vllm, direct: Direct, include):
    greedy = completion("Stop", max_tokens=60, temperature=0, ignore_eos=True)
    text = (await post_json(direct.url, COMPLETIONS, greedy)).json()["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), text
    body = {**greedy, "stop": [stop], "include_stop_str_in_output": include}
    before = await direct.metric('trioserve_engine_aborts_total{reason="stop_string"}')
    ours = await post_json(direct.url, COMPLETIONS, body)
    theirs = await post_json(vllm.reference_url, COMPLETIONS, body)
    assert essentials(ours.json()) == essentials(theirs.json())
    assert ours.json()["choices"][0]["finish_reason"] == "stop"
    assert (stop in ours.json()["choices"][0]["text"]) == include
    assert ours.json()["choices"][0]["stop_reason"] == stop  # and vLLM's, by essentials
    streamed = await stream_essentials(direct.url, COMPLETIONS, body)
    assert streamed == await stream_essentials(vllm.reference_url, COMPLETIONS, body)
    # Over the WebSocket: the SSE route's chunks, as vllm serve streams them.
    chunks, _ = await websocket_chunks(direct.url, COMPLETIONS, body)
    assert _choices(chunks) == _choices(await _sse_chunks(vllm.reference_url, COMPLETIONS, body))
    assert chunks[-1]["choices"][0]["stop_reason"] == stop
    after = await direct.metric('trioserve_engine_aborts_total{reason="stop_string"}')
    assert after == before + 3  # one abort each: JSON, SSE and the WebSocket
    await _idle(direct)


async def test_a_stop_token_ends_with_stop_and_its_id_as_the_stop_reason(
    vllm: Vllm, direct: Direct
):
    # A token of the greedy answer (as test_parity.py takes it), so that it occurs.
    greedy = completion("Stop", max_tokens=40, temperature=0)
    text = (await post_json(direct.url, COMPLETIONS, greedy)).json()["choices"][0]["text"]
    tokens = (await post_json(vllm.reference_url, "/tokenize", {"prompt": text[5:]})).json()
    stop_id = tokens["tokens"][0]
    body = {**greedy, "stop_token_ids": [stop_id]}
    ours = await post_json(direct.url, COMPLETIONS, body)
    theirs = await post_json(vllm.reference_url, COMPLETIONS, body)
    assert essentials(ours.json()) == essentials(theirs.json())
    assert ours.json()["choices"][0]["stop_reason"] == stop_id
    streamed = await stream_essentials(direct.url, COMPLETIONS, body)
    assert streamed == await stream_essentials(vllm.reference_url, COMPLETIONS, body)
    chunks, _ = await websocket_chunks(direct.url, COMPLETIONS, body)
    assert _choices(chunks) == _choices(await _sse_chunks(vllm.reference_url, COMPLETIONS, body))
    assert chunks[-1]["choices"][0]["stop_reason"] == stop_id


async def _idle(direct: Direct) -> None:
    """Until vLLM's scheduler runs and queues nothing (its own figures, relayed)."""
    with trio.fail_after(HANG_GUARD * 4):
        while (
            await direct.metric("trioserve_engine_requests_running")
            + await direct.metric("trioserve_engine_requests_queued")
        ) > 0:
            await trio.sleep(0.2)


@pytest.mark.parametrize(
    ("param", "value"),
    [("top_k", -7), ("min_p", 3.0), ("repetition_penalty", -1.0), ("stop_token_ids", "x")],
)
async def test_a_parameter_vllm_rejects_is_a_400_naming_it_and_the_engine_serves_on(
    vllm: Vllm, direct: Direct, param, value
) -> None:
    # Refused in the frontend's text layer: EngineCore would wedge on such an ADD.
    body = completion("Hi", max_tokens=4, **{param: value})
    ours = await post_json(direct.url, COMPLETIONS, body)
    theirs = await post_json(vllm.reference_url, COMPLETIONS, body)
    assert theirs.status_code == 400 and ours.status_code == 400, ours.text
    assert param in ours.json()["error"]["message"], ours.json()
    after = await post_json(direct.url, COMPLETIONS, completion("Hi", max_tokens=2))
    assert after.status_code == 200


@pytest.mark.parametrize(("path", "body", "says"), REFUSED_AT_THE_DOOR)
async def test_what_vllm_serve_refuses_at_its_door_is_the_same_400(
    vllm: Vllm, direct: Direct, path, body, says
) -> None:
    """Its request and sampling checks: no 422 of a body out of shape, no stream without
    what was asked for."""
    ours = await post_json(direct.url, path, body)
    theirs = await post_json(vllm.reference_url, path, body)
    assert theirs.status_code == 400 and says in theirs.json()["error"]["message"], theirs.text
    assert ours.status_code == 400 and says in ours.json()["error"]["message"], ours.text


async def test_a_client_gone_mid_stream_is_aborted_in_vllms_scheduler(direct: Direct) -> None:
    body = {"model": MODEL, **completion("Once upon a time", max_tokens=3000, ignore_eos=True)}
    body["stream"] = True
    before = await direct.metric('trioserve_engine_aborts_total{reason="disconnect"}')
    async with client(direct.url) as http, http.stream("POST", COMPLETIONS, json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                break
    await _idle(direct)
    after = await direct.metric('trioserve_engine_aborts_total{reason="disconnect"}')
    assert after == before + 1


async def test_tool_answers_are_vllm_serves_answers_json_and_streamed(
    vllm: Vllm, direct: Direct
) -> None:
    # The frontend reads the engine's text with its hermes parser and hands EngineCore
    # vLLM's structural tag for a forced call: each answer, JSON and streamed, is what
    # vllm serve (the same parser flags) answers.
    auto = await tool_answers_as_vllm_serves_them(direct.url, vllm.reference_url, "auto")
    assert auto["tool_calls"] == []  # the tiny model calls none
    named = {"type": "function", "function": {"name": "get_weather"}}
    await tool_answers_as_vllm_serves_them(direct.url, vllm.reference_url, "required")
    strict = await tool_answers_as_vllm_serves_them(
        direct.url, vllm.reference_url, named, STRICT_WEATHER_TOOLS
    )
    # Cut off by max_tokens (the tiny model may write JSON's whitespace), JSON answers
    # the call as text, in both servers alike.
    assert strict["tool_calls"] or strict["finish_reason"] == "length"
    await _idle(direct)


async def test_the_enginecore_killed_ends_every_request_with_an_error_and_stops_the_server(
    direct: Direct,
) -> None:
    started = re.search(r"started vLLM's EngineCore for \S+ \(pid (\d+)\)", direct.output())
    assert started is not None
    body = {"model": MODEL, **completion("Once upon a time", max_tokens=3000, ignore_eos=True)}
    body["stream"] = True
    async with client(direct.url) as http:
        async with http.stream("POST", COMPLETIONS, json=body) as response:
            lines = response.aiter_lines()
            async for line in lines:
                if line.startswith("data: {"):
                    # vLLM's launcher and its EngineCore: the whole group.
                    os.killpg(int(started[1]), signal.SIGKILL)
                    break
            rest = [line async for line in lines]
        assert any("engine_lost" in line for line in rest), rest
        health = await http.get("/health")
        assert health.status_code == 503
    with trio.fail_after(START_GUARD):
        while direct.process.poll() is None:
            await trio.sleep(0.2)
    assert direct.process.returncode == 1, direct.output()[-3000:]
    assert "engine_lost" in direct.output() or "is lost" in direct.output()

"""What the vLLM tests share: a frontend on the session's engine, and reading answers."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import trio
import trio_websocket

from tests.helpers.frontends import Frontend, start_frontend
from tests.helpers.vllm_session import FRONTEND_TIMEOUT, MODEL, Vllm
from tests.helpers.waiting import HANG_GUARD
from trioserve.http.writers.openai import merge_logprobs

#: An answer that runs for seconds on the tiny model.
MAX_TOKENS = 4000
LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "ignore_eos": True}

#: Ceiling on waiting for vLLM to settle (a hang guard, not a measurement).
SETTLE_GUARD = 120.0

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(content: str, **params: Any) -> dict[str, Any]:
    """A chat completion's body: one user message, and ``params``."""
    return {"messages": [{"role": "user", "content": content}], **params}


def completion(prompt: str, **params: Any) -> dict[str, Any]:
    """A completion's body: ``prompt``, and ``params``."""
    return {"prompt": prompt, **params}


async def figures(vllm: Vllm) -> dict[str, float]:
    return await trio.to_thread.run_sync(vllm.metrics)


def _idle(f: dict[str, float]) -> bool:
    ended = f["trioserve_engine_finished_total"] + f["trioserve_engine_aborted_total"]
    ended += f["trioserve_engine_orphaned_total"]
    return (
        f["vllm:num_requests_running"] == 0
        and f["vllm:num_requests_waiting"] == 0
        and f["vllm:kv_cache_usage_perc"] == 0
        and ended == f["trioserve_engine_submitted_total"]
    )


async def settled(vllm: Vllm) -> dict[str, float]:
    """vLLM's figures once it runs nothing and every submitted request has ended."""
    with trio.fail_after(SETTLE_GUARD):
        while not _idle(f := await figures(vllm)):
            await trio.sleep(0.1)
    return f


async def reached_vllm(vllm: Vllm, before: dict[str, float]) -> None:
    """Until the engine has received a submit since ``before`` (its own count)."""
    name = "trioserve_engine_submitted_total"
    with trio.fail_after(SETTLE_GUARD):
        while (await figures(vllm))[name] <= before[name]:
            await trio.sleep(0.05)


async def running_in_vllm(vllm: Vllm, count: int = 1) -> None:
    with trio.fail_after(SETTLE_GUARD):
        while (await figures(vllm))["vllm:num_requests_running"] < count:
            await trio.sleep(0.05)


async def frontend_on(nursery: trio.Nursery, vllm: Vllm, **settings: Any) -> Frontend:
    """A trioserve frontend (in-process, built-in server) on the session's vLLM engine."""
    settings.setdefault("engines", [vllm.address])
    settings.setdefault("heartbeat_timeout", FRONTEND_TIMEOUT)
    return await start_frontend(nursery, None, server="builtin", **settings)


def client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=HANG_GUARD * 3)


async def post_json(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    async with client(url) as http:
        return await http.post(path, json={"model": MODEL, **body})


async def websocket_chunks(
    url: str, path: str, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The chunks of one request over /v1/ws, and its done's usage."""
    endpoint = "chat.completions" if path == CHAT else "completions"
    request = {"type": "request", "id": "n", "endpoint": endpoint, "body": {"model": MODEL, **body}}
    chunks = []
    with trio.fail_after(HANG_GUARD * 3):
        async with trio_websocket.open_websocket_url(url.replace("http", "ws") + "/v1/ws") as ws:
            await ws.send_message(json.dumps(request))
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                chunks.append(message["data"])
    assert message["type"] == "done", message
    return chunks, message["usage"]


def text_of(answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def essentials(answer: dict[str, Any]) -> dict[str, Any]:
    """What a client of either server reads from a JSON answer (``stop_reason``: vLLM's
    own field, the stop string or stop token id that ended it, null otherwise)."""
    usage = answer["usage"]
    return {
        "text": text_of(answer),
        "finish_reason": answer["choices"][0]["finish_reason"],
        "stop_reason": answer["choices"][0]["stop_reason"],
        "usage": [usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]],
    }


async def stream_essentials(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The same, read from an SSE stream (with the usage chunk asked for)."""
    body = {"model": MODEL, **body, "stream": True, "stream_options": {"include_usage": True}}
    text, finish, stop_reason, usage = [], None, None, None
    async with client(url) as http, http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                u = chunk["usage"]
                usage = [u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]]
            for choice in chunk["choices"]:
                delta = choice.get("delta", {}).get("content") or choice.get("text") or ""
                text.append(delta)
                if choice.get("finish_reason"):
                    finish, stop_reason = choice["finish_reason"], choice["stop_reason"]
    return {
        "text": "".join(text),
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "usage": usage,
    }


async def stream_logprobs(url: str, path: str, body: dict[str, Any]) -> Any:
    """The log probabilities of a streamed answer, merged across its chunks."""
    merged: Any = None
    async with (
        client(url) as http,
        http.stream("POST", path, json={"model": MODEL, **body, "stream": True}) as response,
    ):
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                piece = choice.get("logprobs")
                if piece is None:
                    continue
                if "content" in piece:
                    piece = piece["content"] or []
                merged = merge_logprobs(merged, piece)
    return merged


TEXT = "Grüße aus Köln 日本語 🙂"
CONTINUED = [
    {"role": "user", "content": "Tell a story"},
    {"role": "assistant", "content": "Once upon a time"},
]
#: vLLM's additions to an answer, served from the token ids of the text layer (the direct
#: path's frontend, the shared engine): (path, body, whether vLLM streams it too; it
#: refuses prompt_logprobs > 0 streamed).
DETAIL_CASES = [
    (COMPLETIONS, completion(TEXT, max_tokens=8, temperature=0, echo=True), True),
    (COMPLETIONS, completion(TEXT, max_tokens=8, temperature=0, echo=True, logprobs=2), True),
    (
        COMPLETIONS,
        completion(TEXT, max_tokens=6, temperature=0, echo=True, logprobs=1, return_token_ids=True),
        True,
    ),
    (COMPLETIONS, completion(TEXT, max_tokens=6, temperature=0, prompt_logprobs=2), False),
    (COMPLETIONS, completion("Hi", max_tokens=6, temperature=0, return_token_ids=True), True),
    (CHAT, chat(TEXT, max_tokens=8, temperature=0, return_token_ids=True), True),
    (
        CHAT,
        chat("Hi", max_tokens=6, temperature=0, prompt_logprobs=1, logprobs=True, top_logprobs=2),
        False,
    ),
    (CHAT, {"messages": CONTINUED, "max_tokens": 8, "temperature": 0, "echo": True}, True),
    (CHAT, chat("Hi", max_tokens=6, temperature=0, echo=True, top_logprobs=0), True),
    # Echo without generation: the prompt alone (one token generated, not shown).
    (COMPLETIONS, completion(TEXT, max_tokens=0, temperature=0, echo=True, logprobs=1), True),
]


#: What vLLM's server refuses in its request and sampling checks, before the engine: (path,
#: body, what its 400 says).
REFUSED_AT_THE_DOOR = [
    (COMPLETIONS, completion("Hi", max_tokens=0), "max_tokens must be at least 1"),
    (CHAT, chat("Hi", max_completion_tokens=0), "max_tokens must be at least 1"),
    (
        COMPLETIONS,
        completion("Hi", max_tokens=4, prompt_logprobs=1, stream=True),
        "`prompt_logprobs` are not available when `stream=True`.",
    ),
    (
        CHAT,
        chat("Hi", max_tokens=4, prompt_logprobs=2, stream=True),
        "`prompt_logprobs` are not available when `stream=True`.",
    ),
]


#: What vLLM's server adds to an answer when asked (``return_token_ids``,
#: ``prompt_logprobs``), on the response (chat's prompt) or on each choice.
DETAILS = ("prompt_token_ids", "prompt_logprobs")


def details(answer: dict[str, Any]) -> dict[str, Any]:
    """A JSON answer's text, logprobs, token ids and prompt details, by where they are."""
    out: dict[str, Any] = {key: answer.get(key) for key in DETAILS}
    out["usage"] = essentials(answer)["usage"]
    out["choices"] = [
        {
            "text": c["message"]["content"] if "message" in c else c["text"],
            "finish_reason": c["finish_reason"],
            "stop_reason": c["stop_reason"],
            "logprobs": _content(c.get("logprobs")),
            "token_ids": c.get("token_ids"),
            **{key: c.get(key) for key in DETAILS},
        }
        for c in answer["choices"]
    ]
    return out


async def stream_details(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The same, read from an SSE stream: the chunks' text, logprobs and token ids
    joined, the prompt's token ids where they first came (chat: on the chunk;
    completions: on the choice)."""
    body = {"model": MODEL, **body, "stream": True}
    text: list[str] = []
    logprobs: Any = None
    token_ids: list[int] | None = None
    prompt: dict[str, Any] = {}
    finish = stop_reason = None
    async with client(url) as http, http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("prompt_token_ids") is not None:
                prompt.setdefault("prompt_token_ids", chunk["prompt_token_ids"])
            for choice in chunk["choices"]:
                text.append(choice.get("delta", {}).get("content") or choice.get("text") or "")
                if choice.get("finish_reason"):
                    finish, stop_reason = choice["finish_reason"], choice["stop_reason"]
                if choice.get("prompt_token_ids") is not None:
                    prompt.setdefault("prompt_token_ids", choice["prompt_token_ids"])
                if choice.get("token_ids") is not None:
                    token_ids = [*(token_ids or ()), *choice["token_ids"]]
                piece = choice.get("logprobs")
                if piece is not None:
                    if "content" in piece:
                        piece = piece["content"] or []
                    logprobs = merge_logprobs(logprobs, piece)
    return {
        "text": "".join(text),
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "logprobs": logprobs,
        "token_ids": token_ids,
        **prompt,
    }


async def details_as_vllm_serves_them(
    url: str, reference_url: str, path: str, body: dict[str, Any], streamed: bool
) -> None:
    """``body`` (one of :data:`DETAIL_CASES`) through trioserve at ``url`` and ``vllm
    serve``: the text, logprobs, token ids and prompt details a client reads are equal, in
    JSON and, where vLLM streams them, in SSE."""
    ours = await post_json(url, path, body)
    theirs = await post_json(reference_url, path, body)
    assert theirs.status_code == 200 and ours.status_code == 200, ours.text
    expected = details(theirs.json())
    assert any(expected.values()), theirs.json()
    assert details(ours.json()) == expected
    if streamed:
        assert await stream_details(url, path, body) == await stream_details(
            reference_url, path, body
        )


def _content(logprobs: Any) -> Any:
    return logprobs["content"] if isinstance(logprobs, dict) and "content" in logprobs else logprobs


#: A tool the tiny model is asked to call (tests/vllm/test_tool_calls_vllm.py and
#: test_direct_vllm.py).
WEATHER_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


#: The same tool, ``strict``: vLLM's structural tag then holds the arguments to its schema
#: too, so the tiny model's forced call is complete well within ``max_tokens``.
STRICT_WEATHER_TOOLS = [
    {"type": "function", "function": {**WEATHER_TOOLS[0]["function"], "strict": True}}
]


def _id_shape(call_id: str) -> str:
    """A call id with its random part (vLLM's ``random_uuid``: 16 hex digits) masked:
    what a client may rely on."""
    return re.sub(r"(?<![0-9a-f])[0-9a-f]{16}$", "<hex>", call_id)


def tool_message(answer: dict[str, Any]) -> dict[str, Any]:
    """What a client of either server reads from a JSON chat answer with tools: the text,
    each call (its id's shape, type and name, each as a list of one, and its argument
    string) and the finish reason."""
    choice = answer["choices"][0]
    calls = [
        ([_id_shape(c["id"])], [c["type"]], [c["function"]["name"]], c["function"]["arguments"])
        for c in choice["message"].get("tool_calls") or []
    ]
    return {
        "content": choice["message"]["content"] or None,
        "tool_calls": calls,
        "finish_reason": choice["finish_reason"],
    }


async def stream_tool_message(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The same, reassembled from an SSE stream's deltas: a call's id, type and name as
    every delta of the call carried them (a value after the call's first delta marked
    ``late``), its argument deltas joined."""
    body = {"model": MODEL, **body, "stream": True}
    content: list[str] = []
    calls: dict[int, tuple[list[Any], list[Any], list[Any], list[str]]] = {}
    finish = None
    async with client(url) as http, http.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    first = call["index"] not in calls
                    ids, types, names, arguments = calls.setdefault(call["index"], ([], [], [], []))
                    function = call.get("function") or {}
                    for seen, value in (
                        (ids, call.get("id") and _id_shape(call["id"])),
                        (types, call.get("type")),
                        (names, function.get("name")),
                    ):
                        if value is not None:
                            seen.append(value if first else ("late", value))
                    arguments.append(function.get("arguments") or "")
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
    return {
        "content": "".join(content) or None,
        "tool_calls": [
            (ids, types, names, "".join(arguments))
            for _, (ids, types, names, arguments) in sorted(calls.items())
        ],
        "finish_reason": finish,
    }


async def tool_answers_as_vllm_serves_them(
    url: str, reference_url: str, choice: Any, tools: list[dict[str, Any]] = WEATHER_TOOLS
) -> dict[str, Any]:
    """The same chat request with ``tools`` and ``tool_choice`` ``choice``, through
    trioserve at ``url`` (``--tool-call-parser hermes``) and ``vllm serve`` (the session's
    reference, ``--enable-auto-tool-choice --tool-call-parser hermes``): the answers a
    client reads are equal, JSON and streamed (the deltas reassembled: call ids' shape,
    names in the call's first delta, argument strings, finish reason). Each server holds
    a forced call to the structural tag it builds itself and parses the greedy text with
    its own hermes parser. Returns trioserve's JSON reading."""
    body = {"messages": WEATHER_QUESTION, "tools": tools, "max_tokens": 80, "temperature": 0}
    body["tool_choice"] = choice
    ours = await post_json(url, CHAT, body)
    theirs = await post_json(reference_url, CHAT, body)
    assert ours.status_code == 200, ours.text
    assert theirs.status_code == 200, theirs.text
    read = tool_message(ours.json())
    assert read == tool_message(theirs.json()), (read, theirs.json())
    streamed = await stream_tool_message(url, body)
    reference = await stream_tool_message(reference_url, body)
    assert streamed == reference, (streamed, reference)
    if read["finish_reason"] != "length":
        # Greedy, one answer either way; cut off, a call begun is answered as text in
        # JSON, while its deltas have been streamed already (by both servers alike).
        assert streamed == read, (streamed, read)
    return read

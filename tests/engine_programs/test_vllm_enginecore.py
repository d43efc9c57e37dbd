"""The shared vLLM engine's backend (engine_programs/vllm_enginecore.py) over the real
EngineCore client, on real ZeroMQ, to a fake engine (tests/helpers/fake_enginecore.py): what
each way a generation ends sends EngineCore, and that a client reads through it (SDK,
trioserve's protocol, a frontend) what it reads on the direct path given the same engine
outputs, without vLLM. (tests/vllm runs it against vLLM itself: parity with `vllm serve`,
aborts seen in vLLM's scheduler.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import trio
from trio_websocket import open_websocket_url

from tests.helpers.fake_enginecore import READY, FakeEngineCore, open_fake_enginecore
from tests.helpers.frontends import Frontend, start_frontend
from tests.helpers.text_models import build_text_model
from tests.helpers.waiting import HANG_GUARD
from tests.helpers.websocket import collect as ws_collect
from tests.helpers.websocket import ws_url
from trioserve.engine_programs.vllm_enginecore import EngineCoreBackend
from trioserve.engine_programs.vllm_figures import EngineFigures
from trioserve.enginecore import codec
from trioserve.enginecore.client import ClientAddresses, EngineCoreClient, open_enginecore_client
from trioserve.errors import EngineLostError, RequestError
from trioserve.links.vllm import VllmLinks, VllmText
from trioserve.protocol import Submit
from trioserve.sdk import serve_engine
from trioserve.sdk.core import Output
from trioserve.text.assets import ModelText
from trioserve.text.registry import ServedText
from trioserve.text.sampling import EngineLimits

ANSWER = "Grüße aus Köln! 日本語 🙂"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelText:
    return ModelText.load(build_text_model(tmp_path_factory.mktemp("plain"), harder=False))


class Engine:
    def __init__(self, backend: EngineCoreBackend, fake: FakeEngineCore) -> None:
        self.backend, self.fake = backend, fake


async def start(nursery: trio.Nursery, tmp_path: Path, model: ModelText) -> Engine:
    fake, client = await enginecore(nursery, tmp_path)
    served = ServedText(model, EngineLimits(READY.max_model_len))
    return Engine(EngineCoreBackend(client, served, ["m"], EngineFigures("m")), fake)


async def enginecore(nursery: trio.Nursery, where: Path) -> tuple[FakeEngineCore, EngineCoreClient]:
    """A fake EngineCore and its connected client, their sockets in ``where``."""
    where.mkdir(exist_ok=True)  # noqa: ASYNC240 (a test's tmp_path)
    pair = ClientAddresses.ipc(str(where), 0)

    async def hold_fake(task_status: trio.TaskStatus[FakeEngineCore]) -> None:
        async with open_fake_enginecore(pair) as fake:
            task_status.started(fake)
            await trio.sleep_forever()

    async def hold_client(task_status: trio.TaskStatus[EngineCoreClient]) -> None:
        try:
            async with open_enginecore_client(
                [pair], 0, load_timeout=HANG_GUARD, heartbeat_interval=0.2
            ) as client:
                task_status.started(client)
                await trio.sleep_forever()
        except EngineLostError:
            pass

    fake: FakeEngineCore = await nursery.start(hold_fake)
    client: EngineCoreClient = await nursery.start(hold_client)
    return fake, client


def submit(**params: Any) -> Submit:
    body = {"max_tokens": 50, "temperature": 0, **params}
    return Submit("r1", "m", "completion", {"prompt": "Once"}, body)


async def first_request(engine: Engine) -> str:
    [engine_id] = await engine.fake.until_added(1)
    return engine_id


async def collect(outputs: AsyncIterator[Output]) -> list[Output]:
    with trio.fail_after(HANG_GUARD):
        return [out async for out in outputs]


def token_steps(model: ModelText, engine_id: str, text: str, last: int | None):
    ids = model.encode(text, add_special_tokens=False)
    for i, token in enumerate(ids):
        final = i == len(ids) - 1
        yield codec.EngineCoreOutput(engine_id, [token], finish_reason=last if final else None)


async def test_an_answer_the_engine_finishes_is_its_text_and_owes_no_abort(
    nursery, tmp_path, model
):
    engine = await start(nursery, tmp_path, model)
    async with trio.open_nursery() as inner:
        results: list[list[Output]] = []

        async def run() -> None:
            results.append(await collect(engine.backend.generate(submit())))

        inner.start_soon(run)
        engine_id = await first_request(engine)
        for step in token_steps(model, engine_id, ANSWER, codec.FinishReason.LENGTH):
            engine.fake.step(step)
    [outputs] = results
    assert "".join(out.data or "" for out in outputs if isinstance(out.data, str)) == ANSWER
    assert outputs[-1].finish_reason == "length"
    assert outputs[-1].usage is not None and outputs[-1].usage.completion_tokens > 0
    assert engine.fake.aborted == []
    assert engine.backend.figures.finished["length"] == 1


async def test_a_stop_string_ends_with_stop_and_one_abort(nursery, tmp_path, model):
    engine = await start(nursery, tmp_path, model)
    async with trio.open_nursery() as inner:
        results: list[list[Output]] = []

        async def run() -> None:
            results.append(await collect(engine.backend.generate(submit(stop=["Köln"]))))

        inner.start_soon(run)
        engine_id = await first_request(engine)
        for step in token_steps(model, engine_id, ANSWER, None):
            engine.fake.step(step)
    [outputs] = results
    assert "".join(out.data or "" for out in outputs if isinstance(out.data, str)) == "Grüße aus "
    assert (outputs[-1].finish_reason, outputs[-1].stop_reason) == ("stop", "Köln")
    await engine.fake.until_aborted(engine_id)
    assert engine.fake.aborted == [engine_id]  # one ABORT: the engine would generate on


async def test_a_cancelled_generation_is_aborted_once(nursery, tmp_path, model):
    engine = await start(nursery, tmp_path, model)
    outputs = engine.backend.generate(submit())
    async with trio.open_nursery() as inner:

        async def first() -> None:
            await anext(outputs)

        inner.start_soon(first)
        engine_id = await first_request(engine)
        engine.fake.step(
            codec.EngineCoreOutput(engine_id, model.encode("Hallo", add_special_tokens=False))
        )
    await outputs.aclose()  # what the SDK does when the frontend aborts
    await engine.fake.until_aborted(engine_id)
    assert engine.fake.aborted == [engine_id]


async def test_a_parameter_vllm_refuses_is_a_400_and_reaches_no_engine(nursery, tmp_path, model):
    engine = await start(nursery, tmp_path, model)
    for params in ({"top_k": -7}, {"lora_request": {"name": "x"}}):
        with pytest.raises(RequestError) as caught:
            await collect(engine.backend.generate(submit(**params)))
        assert caught.value.status == 400
        assert next(iter(params)) in caught.value.message
        # As the direct path answers it: its code, and the parameter named.
        assert (caught.value.type, caught.value.param) == ("invalid_request", next(iter(params)))
    assert engine.fake.added == {}


async def test_a_dead_engine_ends_the_request_with_a_503(nursery, tmp_path, model):
    engine = await start(nursery, tmp_path, model)
    errors: list[RequestError] = []

    async def run() -> None:
        try:
            await collect(engine.backend.generate(submit()))
        except RequestError as exc:
            errors.append(exc)

    async with trio.open_nursery() as inner:
        inner.start_soon(run)
        await first_request(engine)
        engine.fake.send_dead()
    [error] = errors
    assert error.status == 503 and error.type == "engine_unavailable"
    assert engine.fake.aborted == []  # nothing is owed to a dead engine


async def test_the_queue_time_is_the_engines_from_queued_to_first_scheduled(
    nursery, tmp_path, model
):
    # vLLM's request_queue_time: its QUEUED event to its first SCHEDULED (a preemption's
    # later one does not count), on the engine's clock; on the answer's last output for
    # the frontend's trioserve_queue_time, and in the engine's own histogram.
    engine = await start(nursery, tmp_path, model)
    results: list[list[Output]] = []
    async with trio.open_nursery() as inner:

        async def run() -> None:
            results.append(await collect(engine.backend.generate(submit())))

        inner.start_soon(run)
        engine_id = await first_request(engine)
        ids = model.encode(ANSWER, add_special_tokens=False)
        events = [codec.EngineCoreEvent(1, 100.0), codec.EngineCoreEvent(2, 100.25)]
        engine.fake.step(codec.EngineCoreOutput(engine_id, ids[:1], events=events))
        preempted = [codec.EngineCoreEvent(3, 101.0), codec.EngineCoreEvent(2, 102.0)]
        engine.fake.step(codec.EngineCoreOutput(engine_id, ids[1:2], events=preempted))
        engine.fake.step(
            codec.EngineCoreOutput(engine_id, ids[2:], finish_reason=codec.FinishReason.LENGTH)
        )
    [outputs] = results
    assert outputs[-1].queue_time == pytest.approx(0.25)
    assert all(out.queue_time is None for out in outputs[:-1])
    exposition = prometheus_client.generate_latest(engine.backend.figures.registry).decode()
    [total] = [
        line.rsplit(" ", 1)[1]
        for line in exposition.splitlines()
        if line.startswith("vllm:request_queue_time_seconds_sum{")
    ]
    assert float(total) == pytest.approx(0.25)  # one observation of 0.25 s


# -- the shared path answers what the direct path answers ----------------------------------


def _array(fmt: str, rows: list[list[Any]] | list[Any]) -> codec.WireArray:
    if rows and isinstance(rows[0], list):
        flat = [value for row in rows for value in row]
        return codec.WireArray.of(fmt, [len(rows), len(rows[0])], flat)
    return codec.WireArray.of(fmt, [len(rows)], rows)


def answer_of(model: ModelText, request: codec.EngineCoreRequest) -> list[codec.EngineCoreOutput]:
    """What the fake engine answers ``request``: the prompt's logprobs (one prefill step,
    when asked: each position's token, then others), then ``ANSWER``'s tokens one per step,
    with logprobs when asked, up to ``max_tokens``, the last ``length``."""
    params = request.sampling_params
    prompt = request.prompt_token_ids
    steps = []
    asked = params.prompt_logprobs
    if asked is not None:
        width = 1 + max(asked, 0)
        ids = [[token, *range(20, 20 + width - 1)] for token in prompt[1:]]
        values = [[-2.0 - i / 4 for i in range(width)] for _ in ids]
        tensors = codec.PromptLogprobs(
            _array("q", ids), _array("f", values), _array("q", [3] * len(ids))
        )
        steps.append(
            codec.EngineCoreOutput(request.request_id, [], new_prompt_logprobs_tensors=tensors)
        )
    answer = model.encode(ANSWER, add_special_tokens=False)[: params.max_tokens]
    for i, token in enumerate(answer):
        logprobs = None
        if params.logprobs is not None:
            width = 1 + max(params.logprobs, 0)
            row = [token, *range(30, 30 + width - 1)]
            logprobs = codec.Logprobs(
                _array("q", [row]),
                _array("f", [[-0.5 - i / 8 for i in range(width)]]),
                _array("q", [1]),
            )
        final = i == len(answer) - 1
        steps.append(
            codec.EngineCoreOutput(
                request.request_id,
                [token],
                new_logprobs=logprobs,
                finish_reason=codec.FinishReason.LENGTH if final else None,
            )
        )
    return steps


class Side:
    """One of the two paths to a fake EngineCore: its frontend, and the engine it answers
    from."""

    def __init__(self, frontend: Frontend, fake: FakeEngineCore) -> None:
        self.frontend, self.fake = frontend, fake

    async def ask(self, model: ModelText, how: str, path: str, body: dict[str, Any]) -> Any:
        """``body`` sent ``how`` (``json``, ``sse`` or ``ws``), the engine answering the one
        request it gets with :func:`answer_of`: what the client read, less what differs
        by request (ids, times)."""
        before = len(self.fake.added)
        results: list[Any] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._client, how, path, body, results)
            engine_id = (await self.fake.until_added(before + 1))[-1]
            for step in answer_of(model, self.fake.added[engine_id]):
                self.fake.step(step)
        [result] = results
        return result

    async def _client(self, how: str, path: str, body: dict[str, Any], results: list[Any]) -> None:
        frontend = self.frontend
        if how == "ws":
            endpoint = "chat.completions" if path == CHAT else "completions"
            message = {"type": "request", "id": "x", "endpoint": endpoint, "body": body}
            async with open_websocket_url(ws_url(frontend)) as ws:
                await ws.send_message(json.dumps(message))
                seen = await ws_collect(ws, {"x"})
            chunks = [m["data"] for m in seen["x"] if m["type"] == "chunk"]
            rest = [m for m in seen["x"] if m["type"] != "chunk"]
            results.append([_same(_folded(chunks)), *map(_same, rest)])
            return
        async with frontend.client() as http:
            if how == "json":
                response = await http.post(path, json=body)
                assert response.status_code == 200, response.text
                results.append(_same(response.json()))
                return
            async with http.stream("POST", path, json={**body, "stream": True}) as response:
                assert response.status_code == 200, await response.aread()
                lines = [line async for line in response.aiter_lines()]
            chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
            results.append(_same(_folded(chunks)))


#: The fields of a chunk whose strings are pieces of one text.
TEXT_FIELDS = frozenset({"content", "text", "reasoning_content"})


def _folded(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream's chunks as one: where one chunk ends and the next begins is the frontend's
    timing (the outputs of the engine steps one read brings leave as one delta), not part
    of the answer. Texts (:data:`TEXT_FIELDS`) are joined, lists (logprobs, token ids)
    extended, and every other field keeps the last value it had that was not null."""
    folded: dict[str, Any] = {}
    for chunk in chunks:
        _fold(folded, chunk)
    return folded


def _fold(into: dict[str, Any], part: dict[str, Any]) -> None:
    for key, value in part.items():
        if key == "choices":
            by_index = {c["index"]: c for c in into.setdefault("choices", [])}
            for choice in value:
                if choice["index"] not in by_index:
                    into["choices"].append(by_index.setdefault(choice["index"], {}))
                _fold(by_index[choice["index"]], choice)
        elif isinstance(value, dict):
            _fold(into.setdefault(key, {}), value)
        elif _joinable(key, value, into.get(key)):
            into[key] = into[key] + value
        elif value is not None or key not in into:
            into[key] = value


def _joinable(key: str, value: Any, before: Any) -> bool:
    """Lists extend; strings join only in a text field."""
    if isinstance(value, list):
        return isinstance(before, list)
    return key in TEXT_FIELDS and isinstance(value, str) and isinstance(before, str)


def _same(answer: Any) -> Any:
    """An answer without what differs from one request to the next."""
    if isinstance(answer, dict):
        return {k: _same(v) for k, v in answer.items() if k not in ("id", "created")}
    if isinstance(answer, list):
        return [_same(v) for v in answer]
    return answer


def _details(answer: Any) -> set[str]:
    """Which of the prompt's details and token ids an answer carries (not null)."""
    found: set[str] = set()
    if isinstance(answer, dict):
        for key, value in answer.items():
            if key in ("prompt_token_ids", "prompt_logprobs", "token_ids") and value is not None:
                found.add(key)
            found |= _details(value)
    elif isinstance(answer, list):
        for value in answer:
            found |= _details(value)
    return found


@pytest.fixture
async def paths(nursery, tmp_path, model) -> tuple[Side, Side]:
    """The shared path (the backend served by the SDK, a frontend over trioserve's
    protocol) and the direct path (the frontend the EngineCore's client), each on a fake
    EngineCore of its own."""
    shared = await start(nursery, tmp_path / "shared", model)
    engine = await nursery.start(partial(serve_engine, shared.backend, "tcp://127.0.0.1:*"))
    shared_frontend = await start_frontend(nursery, engine, server="builtin")
    fake, client = await enginecore(nursery, tmp_path / "direct")
    links = VllmLinks(client, VllmText(model, EngineLimits(READY.max_model_len)), ["m"])
    direct_frontend = await start_frontend(
        nursery, None, server="builtin", links=[("vllm://m", links)]
    )
    return Side(shared_frontend, shared.fake), Side(direct_frontend, fake)


TEXT = "Grüße aus Köln 日本語 🙂"
CONTINUED = [
    {"role": "user", "content": "Tell a story"},
    {"role": "assistant", "content": "Once upon a time"},
]
#: What a request may ask about its prompt, with and without logprobs: (path, body, the
#: ways it is answered: JSON, SSE, WebSocket; vLLM refuses prompt_logprobs > 0 streamed).
DETAIL_CASES = [
    (COMPLETIONS, {"prompt": TEXT, "max_tokens": 6, "echo": True}, ("json", "sse", "ws")),
    (
        COMPLETIONS,
        {"prompt": TEXT, "max_tokens": 6, "echo": True, "logprobs": 2},
        ("json", "sse", "ws"),
    ),
    (
        COMPLETIONS,
        {"prompt": TEXT, "max_tokens": 5, "echo": True, "logprobs": 1, "return_token_ids": True},
        ("json", "sse", "ws"),
    ),
    (COMPLETIONS, {"prompt": TEXT, "max_tokens": 5, "prompt_logprobs": 2}, ("json",)),
    (
        COMPLETIONS,
        {"prompt": "Hi", "max_tokens": 5, "return_token_ids": True},
        ("json", "sse", "ws"),
    ),
    (
        COMPLETIONS,
        {"prompt": TEXT, "max_tokens": 0, "echo": True, "logprobs": 1},
        ("json", "sse", "ws"),
    ),
    (
        CHAT,
        {
            "messages": [{"role": "user", "content": TEXT}],
            "max_tokens": 6,
            "return_token_ids": True,
        },
        ("json", "sse", "ws"),
    ),
    (
        CHAT,
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 5,
            "prompt_logprobs": 1,
            "logprobs": True,
            "top_logprobs": 2,
        },
        ("json",),
    ),
    (CHAT, {"messages": CONTINUED, "max_tokens": 6, "echo": True}, ("json", "sse", "ws")),
]


async def test_echo_prompt_logprobs_and_token_ids_answer_as_on_the_direct_path(paths, model):
    # (Every case on one pair of paths: each fake EngineCore is a connection to set up.)
    shared, direct = paths
    for path, body, ways in DETAIL_CASES:
        body = {"model": "m", "temperature": 0, **body}
        for how in ways:
            ours = await shared.ask(model, how, path, body)
            assert ours == await direct.ask(model, how, path, body), (how, body)
            if how == "json":  # each case asks for something an answer would otherwise lack
                echoed = TEXT in json.dumps(ours, ensure_ascii=False)  # (ANSWER differs)
                assert _details(ours) or echoed, ours
    # (The direct path's answers are vllm serve's: tests/vllm/test_direct_vllm.py.)


#: Requests refused before any engine sees them (a 400 naming the field): by the text
#: layer, the same message on both paths; a feature neither serves, each path's own way out.
REFUSED = [
    (COMPLETIONS, {"prompt": "Hi", "top_k": -7}, True),
    (COMPLETIONS, {"prompt": "Hi", "max_tokens": 3, "min_tokens": 5}, True),
    (COMPLETIONS, {"prompt": "Hi", "logit_bias": {"999999": 1}}, True),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 2, "stream": True},
        True,
    ),
    (COMPLETIONS, {"prompt": "Hi", "lora_request": {"name": "x"}}, False),
]


async def test_a_refused_request_is_answered_as_on_the_direct_path(paths):
    # The same status and error body: code, type and the parameter named (the shared
    # engine carries the param on trioserve's protocol, ErrorInfo.param).
    shared, direct = paths
    for path, body, same_message in REFUSED:
        errors = []
        for side in (shared, direct):
            async with side.frontend.client() as http:
                answer = await http.post(path, json={"model": "m", **body})
            assert answer.status_code == 400, (body, answer.text)
            errors.append(answer.json()["error"])
        ours, theirs = errors
        assert ours["param"] is not None, ours
        if not same_message:
            del ours["message"], theirs["message"]
        assert ours == theirs, body
    assert shared.fake.added == {} and direct.fake.added == {}

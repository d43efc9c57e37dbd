"""The direct vLLM link's translation, with the engine replaced by a recording client: what
it sends (one ADD per request, one ABORT per early end or stop string), and what the
writers get from token ids (text deltas, usage, finish reasons), with the real text layer.
The real engine's side is tests/vllm/test_direct_vllm.py."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from tests.helpers.frontends import start_frontend
from tests.helpers.text_models import build_text_model
from tests.helpers.waiting import HANG_GUARD
from trioserve.engine import open_engine_client
from trioserve.enginecore import codec
from trioserve.errors import EngineLostError, TextInputError
from trioserve.links.vllm import VllmLinks, VllmText
from trioserve.protocol import Submit
from trioserve.text.assets import ModelText
from trioserve.text.background import BACKGROUND_NICE
from trioserve.text.sampling import EngineLimits


class RecordingCore:
    """What the link needs of an EngineCore client: requests and aborts recorded."""

    client_index = 0

    def __init__(self) -> None:
        self.failure: str | None = None
        self.lost = trio.Event()
        self.on_stats = None
        self.on_pass_end: Callable[[], None] | None = None
        self.added: list[codec.EngineCoreRequest] = []
        self.sinks: dict[str, OnePass] = {}
        self.aborted: list[str] = []

    def add(self, request, sink) -> None:
        if self.failure is not None:
            raise EngineLostError(self.failure)
        self.added.append(request)
        self.sinks[request.request_id] = OnePass(self, sink)

    def end_pass(self) -> None:
        """What the client does after each read of its output socket."""
        if self.on_pass_end is not None:
            self.on_pass_end()

    def abort(self, ids) -> None:
        self.aborted.extend(ids)

    def die(self, why: str) -> None:
        self.failure = why
        for sink in self.sinks.values():
            sink.lost(why)
        self.sinks.clear()
        self.lost.set()


class OnePass:
    """A request's sink as the client calls it: by default each output comes in a read
    pass of its own (``output``); ``within_pass`` leaves the pass open, as the client does
    with the outputs of several steps that were waiting."""

    def __init__(self, core: RecordingCore, sink) -> None:
        self.core = core
        self.sink = sink

    def within_pass(self, output: codec.EngineCoreOutput) -> None:
        self.sink.output(output)

    def output(self, output: codec.EngineCoreOutput) -> None:
        self.sink.output(output)
        self.core.end_pass()

    def lost(self, why: str) -> None:
        self.sink.lost(why)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelText:
    directory: Path = build_text_model(tmp_path_factory.mktemp("plain"), harder=False)
    return ModelText.load(directory)


async def served(nursery: trio.Nursery, core: RecordingCore, model: ModelText):
    text = VllmText(model, EngineLimits(max_model_len=512))
    links = VllmLinks(core, text, ["m"])  # type: ignore[arg-type]
    client = await nursery.start(_client, links)
    return client


async def _client(links, task_status) -> None:
    async with open_engine_client([], lambda *a: None, links=[("vllm://m", links)]) as client:  # type: ignore[arg-type,return-value]
        task_status.started(client)
        await trio.sleep_forever()


CHAT = [{"role": "user", "content": "Hi"}]


def completion(request_id: str, prompt: str, **params) -> Submit:
    return Submit(request_id, "m", "completion", {"prompt": prompt}, {"temperature": 0, **params})


async def run(client, core, model, message, answer: str):
    prepared = await client.prepare(message, "completion")
    sub = client.submit(prepared, "completion")
    [request] = [r for r in core.added if r.request_id not in core.aborted][-1:]
    ids = model.encode(answer, add_special_tokens=False)
    sink = core.sinks[request.request_id]
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        sink.output(
            codec.EngineCoreOutput(
                request.request_id,
                [token],
                finish_reason=codec.FinishReason.LENGTH if last else None,
            )
        )
        if sub.done:
            break
    items = []
    while batch := await sub.receive_batch():
        items += batch
    return request, sub, items


async def test_token_ids_become_text_deltas_usage_and_the_finish_reason(nursery, model):
    core = RecordingCore()
    client = await served(nursery, core, model)
    answer = "Grüße aus Köln! 日本語 🙂"
    request, sub, items = await run(
        client, core, model, completion("a", "Hi", max_tokens=40), answer
    )
    assert "".join(i.data or "" for i in items) == answer
    assert items[-1].finish_reason == "length" and sub.state == "finished"
    assert items[-1].usage.prompt_tokens == len(request.prompt_token_ids)
    assert items[-1].usage.completion_tokens == len(model.encode(answer, add_special_tokens=False))
    assert core.aborted == []  # the engine finished it: no abort
    assert request.sampling_params.max_tokens == 40


@pytest.mark.parametrize("include", [False, True])
async def test_a_stop_string_concludes_with_stop_and_one_abort(nursery, model, include):
    core = RecordingCore()
    client = await served(nursery, core, model)
    message = completion(
        "s", "Hi", max_tokens=100, stop=["Köln"], include_stop_str_in_output=include
    )
    request, sub, items = await run(client, core, model, message, "Grüße aus Köln! and more")
    text = "".join(i.data or "" for i in items)
    assert text == ("Grüße aus Köln" if include else "Grüße aus ")
    assert items[-1].finish_reason == "stop" and sub.state == "concluded"
    assert items[-1].stop_reason == "Köln"  # vLLM's stop_reason: the string matched
    assert core.aborted == [request.request_id]


async def test_a_stop_token_ends_with_stop_and_its_id_as_the_stop_reason(nursery, model):
    core = RecordingCore()
    client = await served(nursery, core, model)
    stop_id = model.encode(" more", add_special_tokens=False)[-1]
    message = completion("t", "Hi", max_tokens=100, stop_token_ids=[stop_id])
    sub = client.submit(await client.prepare(message, "completion"), "completion")
    [request] = core.added
    sink = core.sinks[request.request_id]
    sink.output(codec.EngineCoreOutput(request.request_id, [5, 6]))
    sink.output(
        codec.EngineCoreOutput(
            request.request_id, [stop_id], finish_reason=codec.FinishReason.STOP,
            stop_reason=stop_id,
        )
    )  # fmt: skip
    items = []
    while batch := await sub.receive_batch():
        items += batch
    assert (items[-1].finish_reason, items[-1].stop_reason) == ("stop", stop_id)
    assert core.aborted == []  # the engine ended it


async def test_what_the_direct_path_does_not_serve_is_a_400_before_any_add(nursery, model):
    core = RecordingCore()
    client = await served(nursery, core, model)
    for params in (
        {"lora_request": {"name": "x"}},
        {"n": 0},
        {"max_tokens": 10_000},
        {"priority": "high"},
        {"priority": 2**63},
    ):
        with pytest.raises(TextInputError):
            await client.prepare(completion("x", "Hi", **params), "completion")
    assert core.added == []


def decoded(fmt: str, shape: list[int], values: list) -> codec.WireArray:
    """An array as the codec decodes one (its raw bytes in place)."""
    sent = codec.WireArray.of(fmt, shape, values)
    return codec.WireArray(sent.dtype, sent.shape, sent.data.data)


async def test_echo_token_ids_and_prompt_logprobs_come_with_the_first_item(nursery, model):
    core = RecordingCore()
    client = await served(nursery, core, model)
    message = completion(
        "e", "Grüße", max_tokens=5, echo=True, return_token_ids=True, prompt_logprobs=1, priority=3
    )
    prepared = await client.prepare(message, "completion")
    sub = client.submit(prepared, "completion")
    [request] = core.added
    assert request.priority == 3 and request.sampling_params.prompt_logprobs == 1
    prompt = request.prompt_token_ids
    rows = len(prompt) - 1  # every prompt token but the first, with its top one
    top = [[token, 7] for token in prompt[1:]]
    tensors = codec.PromptLogprobs(
        decoded("q", [rows, 2], [i for row in top for i in row]),
        decoded("f", [rows, 2], [-2.0, -1.0] * rows),
        decoded("q", [rows], [5] * rows),
    )
    sink = core.sinks[request.request_id]
    sink.output(codec.EngineCoreOutput(request.request_id, [], new_prompt_logprobs_tensors=tensors))
    answer = model.encode(" Köln", add_special_tokens=False)
    sink.output(codec.EngineCoreOutput(request.request_id, answer[:1]))
    sink.output(
        codec.EngineCoreOutput(
            request.request_id, answer[1:], finish_reason=codec.FinishReason.LENGTH
        )
    )
    items = []
    while batch := await sub.receive_batch():
        items += batch
    first, *rest = items
    # A completion's echo is its prompt: none when the token ids are returned (vLLM's).
    assert "".join(i.data or "" for i in items) == model.decode(answer)
    assert first.prompt_token_ids == prompt
    assert [i for item in items for i in item.token_ids or ()] == answer
    assert first.prompt_logprobs[0] is None and len(first.prompt_logprobs) == len(prompt)
    position = first.prompt_logprobs[1]
    assert list(position) == [str(prompt[1]), "7"]
    assert position[str(prompt[1])]["rank"] == 5 and position["7"]["rank"] == 1
    assert all(i.prompt_token_ids is None and i.prompt_logprobs is None for i in rest)


@pytest.mark.parametrize(
    ("messages", "params", "echoed"),
    [
        ([{"role": "user", "content": "Hi"}], {}, ""),
        ([{"role": "assistant", "content": "Once"}], {}, "Once"),
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            {},
            "a\nb",
        ),
        ([{"role": "user", "content": "Go on"}], {"add_generation_prompt": False}, "Go on"),
    ],
)
async def test_a_chat_echo_is_the_last_message_when_it_has_the_answers_role(
    nursery, model, messages, params, echoed
):
    """vLLM's ``echo`` for chat: the answer's role is the assistant's, or without a
    generation prompt the last message's own."""
    core = RecordingCore()
    client = await served(nursery, core, model)
    message = Submit("c", "m", "chat", {"messages": messages}, {"echo": True, **params})
    prepared = await client.prepare(message, "chat")
    assert prepared.payload.echo == echoed


async def test_the_engine_lost_fails_every_request_once_and_the_link_is_out_of_service(
    nursery, model
):
    core = RecordingCore()
    client = await served(nursery, core, model)
    ended = []
    subs = []
    for i in range(3):
        prepared = await client.prepare(completion(f"r{i}", "Hi", max_tokens=10), "completion")
        subs.append(client.submit(prepared, "completion", on_failure=ended.append))
    core.die("killed")
    assert [s.state for s in subs] == ["lost"] * 3 and len(ended) == 3
    assert core.aborted == []  # a dead engine is not written to
    await trio.testing.wait_all_tasks_blocked()
    assert not client.ready and client.failures() == {"vllm://m": "killed"}


async def test_the_schedulers_figures_reach_routing(nursery, model):
    core = RecordingCore()
    client = await served(nursery, core, model)
    [link] = client.links
    core.on_stats(codec.SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.5))
    assert link.load == 5 and link.kv_cache_usage == 0.5


async def _respond(
    nursery, model, body: dict, path: str = "/v1/completions"
) -> tuple[int, list[dict], RecordingCore]:
    """``body`` through a frontend on the link (the engine answers one token, 5): the
    status, the JSON answer or the stream's chunks, and the engine's record."""
    core = RecordingCore()
    links = VllmLinks(core, VllmText(model, EngineLimits(max_model_len=512)), ["m"])  # type: ignore[arg-type]
    frontend = await start_frontend(nursery, None, server="builtin", links=[("vllm://m", links)])

    async def engine() -> None:
        while not core.added:
            await trio.sleep(0.01)
        [request] = core.added
        output = codec.EngineCoreOutput(
            request.request_id, [5], finish_reason=codec.FinishReason.LENGTH
        )
        core.sinks[request.request_id].output(output)

    nursery.start_soon(engine)
    async with frontend.client() as http:
        if not body.get("stream"):
            response = await http.post(path, json=body)
            return response.status_code, [response.json()], core
        async with http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                return response.status_code, [json.loads(await response.aread())], core
            lines = [line async for line in response.aiter_lines()]
    return 200, [json.loads(line[6:]) for line in lines if line.startswith("data: {")], core


async def _answer(nursery, model, body: dict) -> list[dict]:
    status, answers, _ = await _respond(nursery, model, body)
    assert status == 200, answers
    return answers


async def test_a_streamed_echo_carries_the_prompts_ids_unasked_a_json_one_only_if_asked(
    nursery, model
):
    """As vLLM's completion serving does: its echo branch streams the prompt's token
    ids whether or not ``return_token_ids`` asked for them."""
    body = {"model": "m", "prompt": "Grüße", "echo": True, "max_tokens": 3}
    prompt = model.encode("Grüße", add_special_tokens=True)
    [first, *_] = await _answer(nursery, model, {**body, "stream": True})
    assert first["choices"][0]["prompt_token_ids"] == prompt
    assert first["choices"][0]["text"].startswith("Grüße")
    [answer] = await _answer(nursery, model, body)
    assert "prompt_token_ids" not in answer["choices"][0]
    [asked] = await _answer(nursery, model, {**body, "return_token_ids": True})
    assert asked["choices"][0]["prompt_token_ids"] == prompt
    assert asked["choices"][0]["token_ids"] == [5]
    assert asked["choices"][0]["text"] == model.decode([5])  # no prompt text, as vLLM's


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 0}),
        ("/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": -1}),
        ("/v1/chat/completions", {"model": "m", "messages": CHAT, "max_completion_tokens": 0}),
    ],
)
async def test_max_tokens_below_one_is_vllms_400_before_any_add(nursery, model, path, body):
    """vLLM's server refuses it in its sampling parameters' checks: a 400, not the 422 of
    a body out of shape."""
    status, [answer], core = await _respond(nursery, model, body, path)
    assert status == 400, answer
    got = body.get("max_tokens", body.get("max_completion_tokens"))
    assert answer["error"]["message"] == f"max_tokens must be at least 1, got {got}."
    assert core.added == []


@pytest.mark.parametrize("stream", [False, True])
async def test_an_echo_without_tokens_to_generate_answers_the_prompt_alone(nursery, model, stream):
    """A completion's ``echo`` with ``max_tokens: 0``, as vLLM answers it: the engine
    generates one token, which is not shown."""
    body = {"model": "m", "prompt": "Grüße", "max_tokens": 0, "echo": True, "stream": stream}
    status, answers, core = await _respond(nursery, model, body)
    assert status == 200, answers
    assert "".join(a["choices"][0]["text"] for a in answers if a["choices"]) == "Grüße"
    [request] = core.added
    assert request.sampling_params.max_tokens == 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_prompt_logprobs_streamed_are_refused_as_vllm_refuses_them(nursery, model, path):
    """vLLM's request checks: ``prompt_logprobs`` > 0 (or -1) and ``stream: true`` are a
    400 (its stream chunks have no place for them); 0 streams, without them."""
    body: dict = {"model": "m", "max_tokens": 3, "stream": True, "prompt_logprobs": 1}
    body.update({"messages": CHAT} if "chat" in path else {"prompt": "Hi"})
    status, [answer], core = await _respond(nursery, model, body, path)
    assert status == 400, answer
    assert answer["error"]["message"] == "`prompt_logprobs` are not available when `stream=True`."
    assert answer["error"]["param"] == "prompt_logprobs" and core.added == []
    status, chunks, core = await _respond(nursery, model, {**body, "prompt_logprobs": 0}, path)
    assert status == 200 and chunks
    assert core.added[0].sampling_params.prompt_logprobs == 0
    assert not any("prompt_logprobs" in json.dumps(chunk) for chunk in chunks)


async def test_the_last_item_carries_the_engines_queue_time(nursery, model):
    # EngineCore's QUEUED and first SCHEDULED events (its clock), as vLLM's
    # request_queue_time reads them: on the last item, for trioserve_request_queue_time.
    core = RecordingCore()
    client = await served(nursery, core, model)
    sub = client.submit(await client.prepare(completion("q", "Hi"), "completion"), "completion")
    [request] = core.added
    sink = core.sinks[request.request_id]
    ids = model.encode("Grüße", add_special_tokens=False)
    queued = [codec.EngineCoreEvent(1, 50.0), codec.EngineCoreEvent(2, 50.5)]
    sink.output(codec.EngineCoreOutput(request.request_id, ids[:1], events=queued))
    sink.output(
        codec.EngineCoreOutput(request.request_id, ids[1:], finish_reason=codec.FinishReason.LENGTH)
    )
    items = []
    while batch := await sub.receive_batch():
        items += batch
    assert items[-1].queue_time == pytest.approx(0.5)
    assert all(item.queue_time is None for item in items[:-1])


async def test_the_steps_one_read_brings_leave_in_one_write(nursery, model):
    """A frontend behind its engine finds several steps waiting: a stream's outputs of all
    of them are written at once when the client's pass ends (one SSE event), not one write
    a step. A step alone in its pass still leaves at once."""
    core = RecordingCore()
    links = VllmLinks(core, VllmText(model, EngineLimits(max_model_len=512)), ["m"])  # type: ignore[arg-type]
    frontend = await start_frontend(nursery, None, server="builtin", links=[("vllm://m", links)])
    ids = model.encode(" quick brown fox jumps", add_special_tokens=False)
    body = {"model": "m", "prompt": "Hi", "max_tokens": len(ids), "stream": True}
    events: list[dict] = []
    async with (
        frontend.client() as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        lines = response.aiter_lines()
        with trio.fail_after(HANG_GUARD):
            while not core.added:
                await trio.sleep(0.01)
        [request] = core.added
        sink = core.sinks[request.request_id]
        sink.output(codec.EngineCoreOutput(request.request_id, ids[:1]))  # a pass of its own
        async for line in lines:
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                break
        for token in ids[1:-1]:  # one pass over the steps that were waiting
            sink.within_pass(codec.EngineCoreOutput(request.request_id, [token]))
        core.end_pass()
        last = codec.EngineCoreOutput(
            request.request_id, ids[-1:], finish_reason=codec.FinishReason.LENGTH
        )
        sink.output(last)
        events += [json.loads(line[6:]) async for line in lines if line.startswith("data: {")]
    texts = [event["choices"][0]["text"] for event in events]
    assert "".join(texts) == model.decode(ids)
    assert texts[1] == model.decode(ids[:-1])[len(texts[0]) :]  # the waiting steps: one event
    assert len(events) == 3 + (events[-1]["choices"][0]["text"] == "")


async def test_a_long_prompt_is_prepared_in_a_worker_thread_nicer_than_the_event_loop(
    model, monkeypatch
):
    """A prompt too long to prepare inline is rendered and tokenized in a worker thread that
    runs below the event loop's thread (text.background): on a frontend with one core the
    streams the loop writes keep most of it meanwhile."""

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen: list[int] = []
    text = VllmText(model, EngineLimits(max_model_len=4096))
    prepare_now = text.prepare_now

    def recording(message: Submit):
        seen.append(nice())
        return prepare_now(message)

    monkeypatch.setattr(text, "prepare_now", recording)
    loop = nice()
    await text.prepare(completion("short", "x" * 10))
    await text.prepare(completion("long", "word " * 400))
    assert seen == [loop, min(19, loop + BACKGROUND_NICE)]  # inline, then in a thread
    assert nice() == loop

"""What an EngineCore does wrong, seen through the direct path end to end: a frontend
in-process over the direct link and the real EngineCore client, on real ZeroMQ, to a fake
engine (tests/helpers/fake_enginecore.py) that sends what a real one only does by
accident. Each fault ends what it concerns and nothing else:

- an ERROR output ends its own request with a 500 ``engine_error``; the request beside it
  completes, and neither is aborted (the engine ended both);
- an output for a request the client does not know is answered with one ABORT for it, and
  the request in the same step goes on;
- ``ENGINE_CORE_DEAD``, or heartbeats left unanswered, end every request in flight with one
  503 ``engine_lost`` each, send no ABORT to the dead engine, and ``/health`` answers 503.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers.fake_enginecore import READY, FakeEngineCore, open_fake_enginecore
from tests.helpers.frontends import Frontend, start_frontend
from tests.helpers.text_models import build_text_model
from tests.helpers.waiting import HANG_GUARD
from trioserve.enginecore import codec
from trioserve.enginecore.client import ClientAddresses, EngineCoreClient, open_enginecore_client
from trioserve.errors import EngineLostError
from trioserve.links.vllm import VllmLinks, VllmText
from trioserve.text.assets import ModelText
from trioserve.text.sampling import EngineLimits

MODEL = "m"
ANSWER = "Grüße aus Köln! 日本語 🙂"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelText:
    directory: Path = build_text_model(tmp_path_factory.mktemp("plain"), harder=False)
    return ModelText.load(directory)


class Served:
    def __init__(self, frontend: Frontend, client: EngineCoreClient, fake: FakeEngineCore):
        self.frontend, self.client, self.fake = frontend, client, fake
        self.client_ended = trio.Event()
        self.client_error: BaseException | None = None


async def serve(
    nursery: trio.Nursery, tmp_path: Path, model: ModelText, **client_options: float
) -> Served:
    """The fake engine, the client bound to the addresses it connects to, and a frontend
    over the client's direct link."""
    pair = ClientAddresses.ipc(str(tmp_path), 0)
    client_options.setdefault("heartbeat_interval", 0.2)
    client_options.setdefault("heartbeat_timeout", HANG_GUARD)
    fake: FakeEngineCore = await nursery.start(hold_fake, pair)
    ended = trio.Event()
    errors: list[BaseException] = []

    async def hold_client(task_status: trio.TaskStatus[EngineCoreClient]) -> None:
        try:
            async with open_enginecore_client(
                [pair], 0, load_timeout=HANG_GUARD, **client_options
            ) as client:
                task_status.started(client)
                await trio.sleep_forever()
        except EngineLostError as exc:
            errors.append(exc)
        finally:
            ended.set()

    client: EngineCoreClient = await nursery.start(hold_client)
    assert client.ready == READY
    links = VllmLinks(client, VllmText(model, EngineLimits(READY.max_model_len)), [MODEL])
    frontend = await start_frontend(
        nursery, None, server="builtin", links=[(f"vllm://{MODEL}", links)]
    )
    served = Served(frontend, client, fake)
    served.client_ended = ended
    served.errors = errors  # type: ignore[attr-defined]
    return served


async def hold_fake(pair: ClientAddresses, task_status: trio.TaskStatus[FakeEngineCore]) -> None:
    async with open_fake_enginecore(pair) as fake:
        task_status.started(fake)
        await trio.sleep_forever()


def body(prompt: str, **params: object) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 64, "temperature": 0, **params}


async def sse(http: httpx.AsyncClient, payload: dict, into: list[dict]) -> None:
    """A streamed completion's events (``[DONE]`` as ``{"done": True}``), into ``into``."""
    async with http.stream("POST", "/v1/completions", json={**payload, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                into.append({"done": True})
            elif line.startswith("data: "):
                into.append(json.loads(line[6:]))


def text_of(events: list[dict]) -> str:
    return "".join(e["choices"][0]["text"] for e in events if e.get("choices"))


async def test_an_error_output_ends_its_request_with_a_500_and_the_other_completes(
    nursery, tmp_path, model
) -> None:
    served = await serve(nursery, tmp_path, model)
    fake = served.fake
    ids = model.encode(ANSWER, add_special_tokens=False)
    events: list[dict] = []
    async with served.frontend.client() as http, trio.open_nursery() as requests:
        requests.start_soon(sse, http, body("stream me"), events)
        [streamed] = await fake.until_added(1)
        failing: list[httpx.Response] = []

        async def post() -> None:
            failing.append(await http.post("/v1/completions", json=body("fail me")))

        requests.start_soon(post)
        [_, broken] = await fake.until_added(2)
        # One step carries a token of each; the next fails one and goes on with the other.
        fake.step(codec.EngineCoreOutput(streamed, ids[:1]), codec.EngineCoreOutput(broken, [5]))
        fake.step(
            codec.EngineCoreOutput(broken, [], finish_reason=codec.FinishReason.ERROR),
            codec.EngineCoreOutput(streamed, ids[1:2]),
        )
        fake.step(
            codec.EngineCoreOutput(streamed, ids[2:], finish_reason=codec.FinishReason.LENGTH)
        )
    [answer] = failing
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"]["code"] == "engine_error"
    assert text_of(events) == ANSWER and events[-1] == {"done": True}
    assert fake.aborted == []  # the engine ended both itself
    assert served.client.in_flight == 0 and served.client.failure is None


async def test_an_output_for_an_unknown_request_is_answered_with_one_abort_and_nothing_else(
    nursery, tmp_path, model
) -> None:
    served = await serve(nursery, tmp_path, model)
    fake = served.fake
    ids = model.encode(ANSWER, add_special_tokens=False)
    events: list[dict] = []
    async with served.frontend.client() as http, trio.open_nursery() as requests:
        requests.start_soon(sse, http, body("stream me"), events)
        [known] = await fake.until_added(1)
        # A request this client never sent (a predecessor's on these addresses), in the
        # same step as the known one's first token.
        fake.step(codec.EngineCoreOutput("ghost", [7, 8]), codec.EngineCoreOutput(known, ids[:1]))
        await fake.until_aborted("ghost")
        # Its final output, later, is not aborted again (the engine has ended it).
        fake.step(
            codec.EngineCoreOutput("ghost", [9], finish_reason=codec.FinishReason.LENGTH),
            codec.EngineCoreOutput(known, ids[1:], finish_reason=codec.FinishReason.LENGTH),
        )
    assert text_of(events) == ANSWER and events[-1] == {"done": True}
    assert fake.aborted == ["ghost"]
    assert served.client.unknown_outputs == 2 and served.client.failure is None


async def test_outputs_of_a_request_just_aborted_are_dropped_not_aborted_again(
    nursery, tmp_path, model
) -> None:
    served = await serve(nursery, tmp_path, model)
    fake = served.fake
    async with served.frontend.client() as http:
        async with trio.open_nursery() as waiting:
            waiting.start_soon(partial(http.post, "/v1/completions", json=body("slow")))
            [request_id] = await fake.until_added(1)
            waiting.cancel_scope.cancel()  # the client gives up: its request is aborted
        await fake.until_aborted(request_id)
        # The step that was running when the ABORT arrived still reports the request.
        fake.step(codec.EngineCoreOutput(request_id, [3]))
        with trio.fail_after(HANG_GUARD):
            while served.client.late_outputs == 0:
                await trio.sleep(0.01)
        # One more request through the same socket: everything before it was handled.
        events: list[dict] = []
        async with trio.open_nursery() as requests:
            requests.start_soon(sse, http, body("next"), events)
            [_, after] = await fake.until_added(2)
            fake.step(codec.EngineCoreOutput(after, [5], finish_reason=codec.FinishReason.LENGTH))
    assert fake.aborted == [request_id]  # one ABORT: the late output was not answered
    assert served.client.unknown_outputs == 0


@pytest.mark.parametrize("how", ["engine_core_dead", "heartbeat_unanswered"])
async def test_a_dead_engine_ends_every_request_with_engine_lost_and_health_503(
    nursery, tmp_path, model, how
) -> None:
    options = {"heartbeat_timeout": 0.5} if how == "heartbeat_unanswered" else {}
    served = await serve(nursery, tmp_path, model, **options)
    fake = served.fake
    streams: list[list[dict]] = [[], []]
    async with served.frontend.client() as http:
        async with trio.open_nursery() as requests:
            for events in streams:
                requests.start_soon(sse, http, body("go"), events)
            ids = await fake.until_added(2)
            fake.step(*(codec.EngineCoreOutput(i, [5]) for i in ids))
            if how == "engine_core_dead":
                fake.send_dead()
            else:
                fake.answer_utilities = False  # hung: every heartbeat goes unanswered
        health = await http.get("/health")
    for events in streams:
        assert events[-1]["error"]["code"] == "engine_lost", events
        assert sum("error" in e for e in events) == 1
    assert health.status_code == 503
    assert fake.aborted == []  # nothing is written to a dead engine
    with trio.fail_after(HANG_GUARD):
        await served.client_ended.wait()
    [lost] = served.errors  # type: ignore[attr-defined]
    assert ("ENGINE_CORE_DEAD" if how == "engine_core_dead" else "heartbeat") in str(lost)


def generated_tokens(metrics: str, address: str) -> float:
    prefix = f'trioserve_engine_generation_tokens_total{{engine="{address}"}} '
    [line] = [line for line in metrics.splitlines() if line.startswith(prefix)]
    return float(line.removeprefix(prefix))


async def test_the_first_token_opens_the_stream_and_tokens_are_counted_as_they_come(
    nursery, tmp_path, model
) -> None:
    # A first token that is a third of a character has no text yet: the stream opens all
    # the same (an empty text, as vLLM's server sends it), so a client sees the answer
    # begin with the engine's first token; the engine's tokens are counted step by step.
    served = await serve(nursery, tmp_path, model)
    fake = served.fake
    ids = model.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # one character, several byte-level tokens
    events: list[dict] = []
    address = f"vllm://{MODEL}"  # (its counter is the process's: other tests' counts too)
    async with served.frontend.client() as http, trio.open_nursery() as requests:
        before = generated_tokens((await http.get("/metrics")).text, address)
        requests.start_soon(sse, http, body("smile"), events)
        [request] = await fake.until_added(1)
        fake.step(codec.EngineCoreOutput(request, ids[:1]))
        with trio.fail_after(HANG_GUARD):
            while not events:
                await trio.sleep(0.01)
        assert [e["choices"][0]["text"] for e in events] == [""]
        assert generated_tokens((await http.get("/metrics")).text, address) == before + 1
        fake.step(codec.EngineCoreOutput(request, ids[1:], finish_reason=codec.FinishReason.LENGTH))
        with trio.fail_after(HANG_GUARD):
            while events[-1:] != [{"done": True}]:
                await trio.sleep(0.01)
        after = generated_tokens((await http.get("/metrics")).text, address)
        assert after == before + len(ids)
    assert text_of(events) == "🙂"
    assert [e["choices"][0]["text"] for e in events[:2]] == ["", "🙂"]

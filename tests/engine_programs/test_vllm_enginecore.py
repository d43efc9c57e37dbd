"""The shared vLLM engine's backend (engine_programs/vllm_enginecore.py) over the real
EngineCore client, on real ZeroMQ, to a fake engine (tests/helpers/fake_enginecore.py): what
each way a generation ends sends EngineCore, without vLLM. (tests/vllm runs it against
vLLM itself: parity with `vllm serve`, aborts seen in vLLM's scheduler.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import trio

from tests.helpers.fake_enginecore import READY, FakeEngineCore, open_fake_enginecore
from tests.helpers.text_models import build_text_model
from tests.helpers.waiting import HANG_GUARD
from trioserve.engine_programs.vllm_enginecore import EngineCoreBackend
from trioserve.engine_programs.vllm_figures import EngineFigures
from trioserve.enginecore import codec
from trioserve.enginecore.client import ClientAddresses, EngineCoreClient, open_enginecore_client
from trioserve.errors import EngineLostError, RequestError
from trioserve.protocol import Submit
from trioserve.sdk.core import Output
from trioserve.text.assets import ModelText
from trioserve.text.registry import ServedText
from trioserve.text.sampling import EngineLimits

ANSWER = "Grüße aus Köln! 日本語 🙂"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelText:
    return ModelText.load(build_text_model(tmp_path_factory.mktemp("plain"), harder=False))


class Engine:
    def __init__(self, backend: EngineCoreBackend, fake: FakeEngineCore) -> None:
        self.backend, self.fake = backend, fake


async def start(nursery: trio.Nursery, tmp_path: Path, model: ModelText) -> Engine:
    pair = ClientAddresses.ipc(str(tmp_path), 0)

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
    served = ServedText(model, EngineLimits(READY.max_model_len))
    return Engine(EngineCoreBackend(client, served, ["m"], EngineFigures("m")), fake)


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
    for params in ({"top_k": -7}, {"echo": True}, {"lora_request": {"name": "x"}}):
        with pytest.raises(RequestError) as caught:
            await collect(engine.backend.generate(submit(**params)))
        assert caught.value.status == 400
        assert next(iter(params)) in caught.value.message
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

"""``--workers N`` on the direct vLLM path, the worker's side, without vLLM: real worker
processes (as ``trioserve run`` starts them, told the engine's addresses and ready response
on their stdin) on a fake EngineCore over real ZeroMQ (tests/helpers/fake_enginecore.py).
Each worker is its own client of the engine, its requests stamped with its client index,
and a worker killed with a request in flight is replaced by one that aborts it. With a real
EngineCore: tests/vllm/test_direct_workers.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import attrs
import httpx
import trio

from tests.helpers.fake_enginecore import READY, FakeEngineCore, open_fake_enginecore
from tests.helpers.text_models import build_text_model
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.cli.direct_vllm import WORKER_CONNECT_TIMEOUT, WorkerEngine
from trioserve.config import Settings
from trioserve.enginecore import codec
from trioserve.enginecore.client import ClientAddresses
from trioserve.server import workers
from trioserve.server.workers import Supervisor, worker_command
from trioserve.text.assets import ModelText


async def hold_fake(pair: ClientAddresses, task_status: trio.TaskStatus[FakeEngineCore]) -> None:
    async with open_fake_enginecore(pair) as fake:
        task_status.started(fake)
        await trio.sleep_forever()


@attrs.define
class OneWorker:
    """A supervisor of one direct-path worker, client 1 of a fake EngineCore."""

    text: ModelText
    fake: FakeEngineCore
    supervisor: Supervisor
    done: trio.Event  # set once the supervisor has returned
    told: WorkerEngine  # what the worker was told of the engine
    url: str


async def one_worker(nursery: trio.Nursery, tmp_path: Path, settings: Settings) -> OneWorker:
    model_dir = build_text_model(tmp_path / "model", harder=False)
    pairs = [ClientAddresses.ipc(str(tmp_path), index) for index in range(2)]
    # The engine as the worker's client 1 sees it (client 0 is the supervisor's).
    fake: FakeEngineCore = await nursery.start(hold_fake, pairs[1])
    told = WorkerEngine(
        [[pair.input, pair.output] for pair in pairs],
        codec.encode_ready_response(READY).hex(),
        str(model_dir),
        ["--served-model-name", "m"],
    )
    supervisor = Supervisor(settings, 1, worker_command("trioserve.cli:worker_main"))
    done = trio.Event()

    async def supervise(task_status: trio.TaskStatus[list[str]]) -> None:
        await supervisor.serve(
            engine=attrs.asdict(told),
            engine_wait=WORKER_CONNECT_TIMEOUT,
            handle_signals=False,
            task_status=task_status,
        )
        done.set()

    [url] = await nursery.start(supervise)
    return OneWorker(ModelText.load(model_dir), fake, supervisor, done, told, url)


async def cut_short(http: httpx.AsyncClient, body: dict) -> None:
    """A request whose worker is killed under it."""
    with contextlib.suppress(httpx.HTTPError):
        await http.post("/v1/completions", json=body)


async def test_a_direct_worker_is_its_engines_client_and_its_replacement_aborts_its_orphans(
    nursery, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(workers, "RESTART_DELAY", 0.05)
    settings = Settings(host="127.0.0.1", port=0, drain_delay=0.0, graceful_timeout=2.0)
    one = await one_worker(nursery, tmp_path, settings)
    text, fake, supervisor, done, told, url = (
        one.text,
        one.fake,
        one.supervisor,
        one.done,
        one.told,
        one.url,
    )
    answer = "Grüße aus Köln"
    body = {"model": "m", "prompt": "Hi", "max_tokens": 30, "temperature": 0}
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as http:
        async with trio.open_nursery() as requests:
            answers: list[httpx.Response] = []

            async def post() -> None:
                answers.append(await http.post("/v1/completions", json=body))

            requests.start_soon(post)
            [first] = await fake.until_added(1)
            assert fake.added[first].client_index == 1
            ids = text.encode(answer, add_special_tokens=False)
            fake.step(codec.EngineCoreOutput(first, ids, finish_reason=codec.FinishReason.LENGTH))
        [reply] = answers
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == answer
        # A request in flight, and the worker killed: nothing aborts it ...
        async with trio.open_nursery() as requests:
            requests.start_soon(cut_short, http, body)
            [_, orphan] = await fake.until_added(2)
            old = supervisor.workers[0].pid
            os.kill(old, signal.SIGKILL)
            await wait_until(
                lambda: 0 in supervisor.up and supervisor.workers[0].pid != old,
                "the worker's replacement",
            )
            requests.cancel_scope.cancel()
    assert fake.aborted == []
    # ... until the engine's next output of it reaches the replacement on the same addresses.
    fake.step(codec.EngineCoreOutput(orphan, [5]))
    await fake.until_aborted(orphan)
    assert fake.aborted == [orphan]
    supervisor.drain()
    with trio.fail_after(HANG_GUARD):
        await done.wait()
    assert supervisor.status == 0
    assert json.dumps(told.pairs)  # what a worker is told is JSON


async def test_a_drain_lets_a_direct_workers_request_finish_and_aborts_nothing(
    nursery, tmp_path
) -> None:
    # A rolling update's SIGTERM with a request in flight on a worker of the direct path:
    # the request gets its whole answer, nothing is aborted in the engine, the supervisor
    # exits 0 once its workers have drained.
    # A drain delay (a second of /health 503 while still serving) for the test to see that
    # the worker has begun its drain before the request's last output comes.
    settings = Settings(host="127.0.0.1", port=0, drain_delay=1.0, graceful_timeout=HANG_GUARD)
    one = await one_worker(nursery, tmp_path, settings)
    text, fake, supervisor, done, url = one.text, one.fake, one.supervisor, one.done, one.url
    answer = "Grüße aus Köln"
    body = {"model": "m", "prompt": "Hi", "max_tokens": 30, "temperature": 0}
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as http:

        async def post() -> None:
            answers.append(await http.post("/v1/completions", json=body))

        async with trio.open_nursery() as requests:
            requests.start_soon(post)
            [request] = await fake.until_added(1)
            ids = text.encode(answer, add_special_tokens=False)
            fake.step(codec.EngineCoreOutput(request, ids[:2]))
            supervisor.drain()  # the request is in flight
            with trio.fail_after(HANG_GUARD):
                while (await http.get("/health")).status_code != 503:
                    await trio.sleep(0.02)  # until the worker drains
            fake.step(
                codec.EngineCoreOutput(request, ids[2:], finish_reason=codec.FinishReason.LENGTH)
            )
    [reply] = answers
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == answer
    with trio.fail_after(HANG_GUARD):
        await done.wait()
    assert supervisor.status == 0
    assert fake.aborted == []

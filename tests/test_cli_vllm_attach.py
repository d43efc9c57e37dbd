"""``trioserve run --vllm MODEL --vllm-attach HOST:PORT``: the direct path to an EngineCore
started elsewhere, without vLLM: the frontend in-process (``serve_attached``) and a fake
EngineCore over real ZeroMQ that finds it through the handshake, as a headless vLLM engine
does (tests/helpers/fake_enginecore.py). The engine is served, lost (its request in flight
ends with one ``engine_lost`` error, ``/health`` answers 503, new requests 503) and served
again once another engine connects; the server stops only when drained. With a real
EngineCore: tests/vllm/test_vllm_attach.py."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from typing import Any

import httpx
import msgspec
import pytest
import trio

from tests.helpers.fake_enginecore import READY, FakeEngineCore, attach_fake_enginecore
from tests.helpers.processes import free_port
from tests.helpers.text_models import build_text_model
from tests.helpers.waiting import HANG_GUARD
from trioserve.cli import preflight
from trioserve.cli.direct_vllm import serve_attached
from trioserve.config import Settings
from trioserve.enginecore import codec
from trioserve.errors import CommandError
from trioserve.server.frontend import serve_frontend
from trioserve.text.assets import ModelText

BODY = {"model": "m", "prompt": "Hi", "max_tokens": 30, "temperature": 0}


async def health_becomes(http: httpx.AsyncClient, status: int) -> None:
    with trio.fail_after(HANG_GUARD):
        while (await http.get("/health")).status_code != status:
            await trio.sleep(0.02)


async def answered(http: httpx.AsyncClient, fake: FakeEngineCore, text: ModelText, answer: str):
    replies: list[httpx.Response] = []

    async def post() -> None:
        replies.append(await http.post("/v1/completions", json=BODY))

    async with trio.open_nursery() as requests:
        requests.start_soon(post)
        [request] = await fake.until_added(len(fake.added) + 1)
        ids = text.encode(answer, add_special_tokens=False)
        fake.step(codec.EngineCoreOutput(request, ids, finish_reason=codec.FinishReason.LENGTH))
    [reply] = replies
    return reply


async def hold_attached(
    handshake: str, dies: trio.Event, task_status: trio.TaskStatus[FakeEngineCore]
) -> None:
    """A fake engine attached through ``handshake`` until ``dies`` is set."""
    async with attach_fake_enginecore(handshake) as fake:
        task_status.started(fake)
        await dies.wait()


async def test_an_attached_engine_is_served_lost_waited_for_and_served_again(
    nursery, tmp_path
) -> None:
    model_dir = build_text_model(tmp_path / "model", harder=False)
    text = ModelText.load(model_dir)
    handshake = f"127.0.0.1:{free_port()}"
    settings = Settings(host="127.0.0.1", port=0, drain_delay=0.0, graceful_timeout=2.0)
    frontends: list[Any] = []  # (app, drain, urls)
    up = trio.Event()

    async def serve(*, links: Any, task_status: trio.TaskStatus[Any]) -> None:
        async with trio.open_nursery() as inner:
            started = await inner.start(
                partial(serve_frontend, settings, handle_signals=False, links=links)
            )
            frontends.append(started)
            up.set()
            task_status.started(started)

    statuses: list[int] = []

    async def attached() -> None:
        statuses.append(
            await serve_attached(
                str(model_dir),
                ["--served-model-name", "m"],
                handshake=handshake,
                load_timeout=HANG_GUARD,
                serve=serve,
            )
        )

    nursery.start_soon(attached)
    dies = trio.Event()
    first: FakeEngineCore = await nursery.start(hold_attached, f"tcp://{handshake}", dies)
    with trio.fail_after(HANG_GUARD):
        await up.wait()
    [(_, drain, [url])] = frontends
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as http:
        reply = await answered(http, first, text, "Grüße")
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == "Grüße"
        await health_becomes(http, 200)
        # A request in flight when the engine dies ...
        streamed: list[httpx.Response] = []

        async def post() -> None:
            streamed.append(await http.post("/v1/completions", json=BODY))

        async with trio.open_nursery() as requests:
            requests.start_soon(post)
            await first.until_added(2)
            dies.set()  # the engine dies
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as http:
        # ... ends with its error; the server stays up, unhealthy, refusing.
        [lost] = streamed
        assert lost.status_code == 503, lost.text
        assert lost.json()["error"]["code"] == "engine_lost"
        await health_becomes(http, 503)
        refused = await http.post("/v1/completions", json=BODY)
        assert refused.status_code == 503
        assert first.aborted == []  # nothing is sent to a dead engine
        # Another engine connects to the same handshake address: served again.
        async with attach_fake_enginecore(f"tcp://{handshake}") as second:
            await health_becomes(http, 200)
            reply = await answered(http, second, text, "wieder da")
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["text"] == "wieder da"
            await drain.drain(skip_delay=True)
    with trio.fail_after(HANG_GUARD):
        while not statuses:
            await trio.sleep(0.02)
    assert statuses == [0]


@pytest.mark.parametrize(
    ("attach", "model", "path", "workers", "says"),
    [
        ("127.0.0.1:29550", "", "direct", 1, "give --vllm MODEL too"),
        ("127.0.0.1:29550", "m", "shared", 1, "the direct path's"),
        ("127.0.0.1:29550", "m", "direct", 2, "serves one process"),
        ("29550", "m", "direct", 1, "give HOST:PORT"),
        ("127.0.0.1:http", "m", "direct", 1, "give HOST:PORT"),
    ],
)
def test_attach_misuse_is_one_line_and_status_2(attach, model, path, workers, says) -> None:
    with pytest.raises(CommandError) as raised:
        preflight.check_vllm_attach(attach, model, path, workers)
    assert says in str(raised.value) and raised.value.exit_status == 2


async def test_an_engine_of_another_vllm_release_is_refused_in_one_line_naming_both(
    nursery, tmp_path
) -> None:
    model_dir = build_text_model(tmp_path / "model", harder=False)
    handshake = f"127.0.0.1:{free_port()}"

    async def never_served(**_: Any) -> None:
        raise AssertionError("an engine of another release was served")

    refusals: list[CommandError] = []
    refused = trio.Event()

    async def attached() -> None:
        # (From inside its nursery: `trioserve run` says the group's one CommandError.)
        with pytest.RaisesGroup(CommandError) as raised:
            await serve_attached(
                str(model_dir),
                ["--served-model-name", "m"],
                handshake=handshake,
                load_timeout=HANG_GUARD,  # refused at once, or this says "within"
                serve=never_served,
            )
        refusals.append(raised.value.exceptions[0])
        refused.set()

    newer = msgspec.structs.replace(READY, vllm_version="0.40.1")
    with trio.fail_after(HANG_GUARD):
        async with trio.open_nursery() as both:
            both.start_soon(attached)
            # (Held until refused: an engine that left at once could take its unsent
            # ready response with it.)
            async with attach_fake_enginecore(f"tcp://{handshake}", newer):
                await refused.wait()
    [refusal] = refusals
    assert "0.40.1" in str(refusal) and "0.32.x" in str(refusal), refusal
    assert refusal.exit_status == 1


def test_no_engine_within_the_load_timeout_is_one_line_and_status_1(tmp_path) -> None:
    model_dir = build_text_model(tmp_path / "model", harder=False)
    port = free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trioserve",
            "run",
            "--vllm",
            str(model_dir),
            "--port",
            "0",
            "--vllm-attach",
            f"127.0.0.1:{port}",
            "--vllm-load-timeout",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"no vLLM EngineCore connected to tcp://127.0.0.1:{port} within 0.5 s" in done.stderr

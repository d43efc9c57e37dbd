"""``trioserve run --vllm MODEL --workers N`` on the direct path: N worker processes, each
a client of one EngineCore (docs/engines.md, "Several clients, one engine").

The first tests run the supervisor in-process (``server/workers.py``, real worker processes
started as ``trioserve run`` starts them) on the session's EngineCore
(tests/helpers/enginecore_session.py): each worker is told the engine's addresses and ready
response as ``trioserve run`` tells them (:class:`~trioserve.cli.direct_vllm.WorkerEngine`),
and this test is the engine's client 0, which reads vLLM's scheduler figures. The last test
runs the whole command, the supervisor starting the engine itself and doing the handshake
for N + 1 clients, and kills that engine.

Which worker serves a connection is read from the kernel (tests/process/test_workers.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
from functools import partial

import attrs
import pytest
import trio

from tests.helpers.enginecore_session import ANSWER_GUARD, HeadlessEngine, scheduler_idle
from tests.helpers.processes import Proc
from tests.helpers.vllm_session import MODEL, START_GUARD, VLLM_OPTIONS, vllm_env
from tests.process.test_workers import (
    Connection,
    metric,
    one_connection_per_worker,
    scrape,
    worker_pids,
)
from trioserve.cli.direct_vllm import WORKER_CONNECT_TIMEOUT, WorkerEngine
from trioserve.config import Settings
from trioserve.enginecore import codec
from trioserve.enginecore.client import EngineCoreClient
from trioserve.server import workers
from trioserve.server.workers import Supervisor, worker_command

pytestmark = pytest.mark.integration

DISCONNECTS = 'trioserve_engine_aborts_total{reason="disconnect"}'
SMALL = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0}
LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True}


async def hold_client(
    engine: HeadlessEngine, index: int, task_status: trio.TaskStatus[EngineCoreClient]
) -> None:
    async with engine.client(index) as client:
        task_status.started(client)
        await trio.sleep_forever()


async def start_supervisor(
    nursery: trio.Nursery, engine: HeadlessEngine, count: int
) -> tuple[Supervisor, str]:
    """``count`` direct workers on the session's engine (clients 1 … count)."""
    told = WorkerEngine(
        [[pair.input, pair.output] for pair in engine.pairs],
        codec.encode_ready_response(engine.ready).hex(),
        str(engine.model_dir),
        VLLM_OPTIONS,
        heartbeat_timeout=ANSWER_GUARD,
    )
    assert told.client_index(count - 1) < len(engine.pairs)
    settings = Settings(host="127.0.0.1", port=0, drain_delay=0.0, graceful_timeout=5.0)
    supervisor = Supervisor(settings, count, worker_command("trioserve.cli:worker_main"))
    with trio.fail_after(START_GUARD):
        [url, *_] = await nursery.start(
            partial(
                supervisor.serve,
                engine=attrs.asdict(told),
                engine_wait=WORKER_CONNECT_TIMEOUT,
                handle_signals=False,
            )
        )
    return supervisor, url


def pids(supervisor: Supervisor) -> list[int]:
    return [supervisor.workers[index].pid for index in range(supervisor.count)]


async def aborts(url: str, name: str = DISCONNECTS) -> float:
    probe = await Connection.open(url)
    try:
        text = await scrape(probe)
        try:
            return metric(text, name)
        except AssertionError:  # not counted yet by any worker
            return 0.0
    finally:
        await probe.aclose()


async def until_aborts(url: str, count: float) -> None:
    with trio.fail_after(ANSWER_GUARD):
        while await aborts(url) < count:
            await trio.sleep(0.05)
    assert await aborts(url) == count


async def end_a_stream_early(connection: Connection) -> None:
    """A long streamed completion on ``connection``, read to its first text, then the
    connection closed (the client gone)."""
    payload = json.dumps({**LONG, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {connection.host}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    await connection.stream.send_all(head.encode() + payload)
    with trio.fail_after(ANSWER_GUARD):
        while b'"text"' not in connection.buffer:
            assert await connection._fill(), connection.buffer
    await connection.aclose()


async def test_workers_share_one_enginecore_and_each_early_end_is_one_abort_in_vllm(
    enginecore: HeadlessEngine, nursery
) -> None:
    probe: EngineCoreClient = await nursery.start(hold_client, enginecore, 0)
    supervisor, url = await start_supervisor(nursery, enginecore, 2)
    connections = await one_connection_per_worker(url, pids(supervisor))
    # Each worker answers from the one engine: the same greedy text.
    texts = []
    for connection in connections.values():
        status, body = await connection.request("POST", "/v1/completions", SMALL)
        assert status == 200, body
        texts.append(json.loads(body)["choices"][0]["text"])
    assert texts[0] == texts[1] and texts[0]
    # An early end in each worker, one after the other: one abort each, vLLM idle after each.
    before = await aborts(url)
    for n, connection in enumerate(connections.values(), 1):
        await end_a_stream_early(connection)
        await until_aborts(url, before + n)
        stats = await scheduler_idle(probe)
        assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (
            0,
            0,
            0.0,
        )
    assert probe.unknown_outputs == 0  # no other client's outputs came here
    supervisor.drain()


async def test_a_killed_workers_requests_are_aborted_by_its_replacement(
    enginecore: HeadlessEngine, nursery, monkeypatch
) -> None:
    """A worker killed mid-stream sends no abort, and EngineCore does not reclaim a silent
    client's requests: its replacement, bound to the same addresses, receives their
    outputs and aborts them."""
    monkeypatch.setattr(workers, "RESTART_DELAY", 0.05)
    probe: EngineCoreClient = await nursery.start(hold_client, enginecore, 0)
    supervisor, url = await start_supervisor(nursery, enginecore, 1)
    [old] = pids(supervisor)
    connection = await Connection.open(url)
    payload = json.dumps({**LONG, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {connection.host}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    await connection.stream.send_all(head.encode() + payload)
    with trio.fail_after(ANSWER_GUARD):
        while b'"text"' not in connection.buffer:
            assert await connection._fill()
    os.kill(old, signal.SIGKILL)
    with trio.fail_after(ANSWER_GUARD):
        while 0 not in supervisor.up or supervisor.workers[0].pid == old:
            await trio.sleep(0.05)
    # The engine ran the orphan on: vLLM's figures say it runs nothing once the new worker
    # has aborted it (its unknown outputs, answered with an ABORT).
    stats = await scheduler_idle(probe)
    assert (stats.num_running_reqs, stats.kv_cache_usage) == (0, 0.0)
    await connection.aclose()
    supervisor.drain()


async def test_run_vllm_with_workers_serves_from_one_child_enginecore_until_it_dies(
    tiny_model, nursery
) -> None:
    """The whole command: the supervisor starts one EngineCore for N + 1 clients; each
    worker serves; the engine killed under load ends each worker's stream with
    ``engine_lost``, /health turns 503, and the run stops with status 1."""
    python, model_dir = tiny_model
    frontend = await Proc.start(
        nursery,
        "run",
        "--port",
        "0",
        "--workers",
        "2",
        "--vllm",
        str(model_dir),
        "--vllm-args",
        shlex.join(VLLM_OPTIONS),
        python=python,
        env=vllm_env(),
    )
    match = await frontend.wait_for_output(
        r"Running on (http://127\.0\.0\.1:\d+) with 2 workers", guard=START_GUARD
    )
    url = match[1].decode()
    output = frontend.output.decode()
    started = re.findall(r"started vLLM's EngineCore for \S+ \(pid (\d+)\)", output)
    assert len(started) == 1, output[-3000:]
    connections = await one_connection_per_worker(url, worker_pids(frontend, 2))
    for connection in connections.values():
        status, body = await connection.request("POST", "/v1/completions", SMALL)
        assert status == 200, body
    payload = json.dumps({**LONG, "stream": True}).encode()
    for connection in connections.values():
        head = (
            f"POST /v1/completions HTTP/1.1\r\nhost: {connection.host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
        )
        await connection.stream.send_all(head.encode() + payload)
        with trio.fail_after(ANSWER_GUARD):
            while b'"text"' not in connection.buffer:
                assert await connection._fill()
    os.killpg(int(started[0]), signal.SIGKILL)  # vLLM's launcher, EngineCore, its worker
    for connection in connections.values():
        with trio.fail_after(ANSWER_GUARD):
            while b"engine_lost" not in connection.buffer:
                assert await connection._fill(), connection.buffer[-500:]
    health = await Connection.open(url)
    assert (await health.request("GET", "/health"))[0] == 503
    await health.aclose()
    with trio.fail_after(START_GUARD):
        assert await frontend.process.wait() == 1
    assert "is lost" in (await frontend.all_output()).decode()

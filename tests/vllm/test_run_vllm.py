"""One command serves a real model: ``trioserve run --vllm MODEL --vllm-path shared`` (the
adapter, ``trioserve engine vllm``), used with the openai client. The direct path, the
default: test_direct_vllm.py."""

from __future__ import annotations

import os
import re
import shlex
import signal

import openai
import pytest
import trio

from tests.helpers.processes import Proc
from tests.helpers.vllm_session import MODEL, START_GUARD, VLLM_OPTIONS, vllm_env

pytestmark = pytest.mark.integration


async def test_run_vllm_serves_the_model_to_the_openai_client(tiny_model, nursery) -> None:
    python, model_dir = tiny_model
    # No --drain-delay: the drain's steps are the same, without 5 s of serving on for
    # load balancers (tests/process/test_cli_signals.py holds that wait).
    frontend = await Proc.start(
        nursery,
        "run",
        "--port",
        "0",
        "--drain-delay",
        "0",
        "--vllm",
        str(model_dir),
        "--vllm-args",
        shlex.join(VLLM_OPTIONS),
        "--vllm-path",
        "shared",
        python=python,
        env=vllm_env(),
    )
    # It listens once the model is loaded, and says so while it loads.
    running = r"Running on (http://127\.0\.0\.1:\d+)"
    match = await frontend.wait_for_output(running, guard=START_GUARD)
    url = match[1].decode()
    assert b"vLLM engine serving tiny" in frontend.output
    # vLLM keeps busy on every CPU it may use: it is kept off the last one, which the
    # frontend needs to send its aborts in time (tests/helpers/vllm_session.py says why).
    started = re.search(rb"started the vLLM engine for \S+ \(pid (\d+)\)", frontend.output)
    assert started is not None
    status = await trio.Path(f"/proc/{int(started[1])}/status").read_text()
    listed = re.search(r"Cpus_allowed_list:\s*(\S+)", status)
    assert listed is not None
    engine_cpus = set()
    for part in listed[1].split(","):
        first, _, last = part.partition("-")
        engine_cpus.update(range(int(first), int(last or first) + 1))
    available = sorted(os.sched_getaffinity(0))
    if len(available) > 1:
        assert engine_cpus == set(available[:-1])

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    answer = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    chunks = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    streamed = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    assert streamed == answer.choices[0].message.content

    # SIGTERM drains the frontend, then stops the engine; the run exits 0.
    frontend.signal(15)
    with trio.fail_after(START_GUARD):
        assert await frontend.process.wait() == 0
    assert b"stopped (exit code 0)" in await frontend.all_output()


def _engine_cores(pid: int) -> list[int]:
    """The descendants of process ``pid`` that are vLLM's EngineCore (by their title): the
    engine's launcher's child (``trioserve engine vllm`` → launcher → EngineCore)."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in os.listdir(f"/proc/{parent}/task"):
            with open(f"/proc/{parent}/task/{task}/children") as children:
                for child in children.read().split():
                    with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                        if b"EngineCore" in cmdline.read():
                            found.append(int(child))
                        else:
                            pending.append(int(child))
    return found


async def test_run_vllm_stops_with_status_1_when_the_enginecore_dies(tiny_model, nursery) -> None:
    python, model_dir = tiny_model
    # vLLM's EngineCore killed behind the shared engine (`trioserve engine vllm`): it used
    # to keep answering pings while every request failed, /health 200 for 30 s and more.
    # Now it exits when its EngineCore client loses the engine, and the run stops with
    # status 1.
    frontend = await Proc.start(
        nursery,
        "run",
        "--port",
        "0",
        "--vllm",
        str(model_dir),
        "--vllm-args",
        shlex.join(VLLM_OPTIONS),
        "--vllm-path",
        "shared",
        python=python,
        env=vllm_env(),
    )
    match = await frontend.wait_for_output(
        r"Running on (http://127\.0\.0\.1:\d+)", guard=START_GUARD
    )
    started = re.search(rb"started the vLLM engine for \S+ \(pid (\d+)\)", frontend.output)
    assert started is not None
    cores = _engine_cores(int(started[1]))
    assert len(cores) == 1, cores
    os.kill(cores[0], signal.SIGKILL)
    with trio.fail_after(START_GUARD):
        assert await frontend.process.wait() == 1
    output = await frontend.all_output()
    assert b"vLLM's EngineCore is dead; stopping this engine" in output
    assert b"exited with code 1; stopping" in output
    assert match is not None

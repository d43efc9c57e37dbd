"""`trioserve` as a user runs it: real processes, real ports on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest
import trio

from tests.helpers.processes import free_port, start_frontend_process, start_mock_engine
from tests.helpers.waiting import HANG_GUARD
from trioserve.engine_programs.mock import expected_text

pytestmark = pytest.mark.integration


def test_help_lists_every_option():
    out = subprocess.run(
        [sys.executable, "-m", "trioserve", "run", "--help"], capture_output=True, text=True
    ).stdout
    for option in (
        "--host",
        "--port",
        "--engine",
        "--request-timeout",
        "--stream-buffer",
        "--heartbeat-timeout",
        "--drain-delay",
        "--graceful-timeout",
    ):
        assert option in out
    engine = subprocess.run(
        [sys.executable, "-m", "trioserve", "engine", "mock", "--help"],
        capture_output=True,
        text=True,
    ).stdout
    for option in ("--bind", "--tokens-per-second", "--ttft-ms", "--log-aborts", "--loop"):
        assert option in engine


async def test_run_without_engine_starts_the_mock_and_ctrl_c_stops_everything(nursery):
    frontend, url = await start_frontend_process(nursery, "--drain-delay", "0.2")
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        # "Running on" means ready: the first request is served, not refused (503).
        response = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "stream": True},
        )
        assert response.text.endswith("data: [DONE]\n\n")
        assert expected_text("hi", 16).split()[0] in response.text
    engine_pid = int(
        (await frontend.wait_for_output(r"started the mock engine \(pid (\d+)\)")).group(1)
    )
    frontend.signal(signal.SIGINT)
    assert await frontend.wait() == 0
    await frontend.wait_for_output(r"mock engine stopped \(exit code 0\)")
    with pytest.raises(ProcessLookupError):
        os.kill(engine_pid, 0)


async def test_engine_with_another_protocol_version_fails_alone_and_run_serves_on(nursery):
    # It used to stop `trioserve run` with status 2, and with it every other engine's
    # traffic: now that engine is marked failed (one log line) and readiness says so.
    import zmq

    from trioserve.protocol import PROTOCOL_VERSION, ModelCard, Welcome, encode

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    try:
        frontend, url = await start_frontend_process(nursery, "--engine", address)
        with trio.fail_after(HANG_GUARD):
            while True:
                try:
                    ident, _hello = sock.recv_multipart(zmq.NOBLOCK)
                    break
                except zmq.Again:
                    await trio.sleep(0.01)
        welcome = Welcome(PROTOCOL_VERSION + 1, "future", "s", [ModelCard("m")], ["chat"])
        sock.send_multipart([ident, encode(welcome)])
        await frontend.wait_for_output("speaks protocol version")
        async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
            assert (await client.get("/health")).status_code == 503
            assert (await client.get("/live")).status_code == 200
        assert frontend.process.returncode is None
        frontend.signal(signal.SIGINT)
        assert await frontend.wait() == 0
        assert frontend.output.count(b"failed: it speaks protocol version") == 1
    finally:
        sock.close(linger=0)


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
async def test_a_mock_engine_whose_parent_died_before_it_started_exits(loop):
    # `trioserve run` gives the engine its pid: if it dies while the engine is still
    # starting, the engine, already an orphan, must still notice (it used to watch for a
    # change of its parent at start, which was init by then, and ran forever).
    gone = await trio.lowlevel.open_process([sys.executable, "-c", "pass"])
    await gone.wait()
    command = [sys.executable, "-m", "trioserve", "engine", "mock", "--loop", loop]
    command += ["--bind", f"tcp://127.0.0.1:{free_port()}", "--exit-with-parent", str(gone.pid)]
    with trio.fail_after(HANG_GUARD):
        result = await trio.run_process(command, capture_stderr=True, check=False)
    assert result.returncode == 0
    assert f"parent process {gone.pid} is gone; stopping".encode() in result.stderr


async def test_a_port_in_use_is_one_line_and_status_1_not_a_traceback():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = await trio.run_process(
            [sys.executable, "-m", "trioserve", "run", "--port", str(port)],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1  # the command line is right; the port is taken
    [line] = result.stderr.decode().splitlines()  # nothing started before it
    assert f"cannot listen on 127.0.0.1 port {port}: Address already in use; " in line
    assert b"Traceback" not in result.stderr


async def test_an_unreachable_engine_is_said_once_until_its_reason_changes_and_when_it_connects(
    nursery,
):
    # Nothing listens on the port: every attempt (at DEBUG) is refused, and the operator is
    # told once, at WARNING, why and what to check. Then an engine comes up there.
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    frontend, url = await start_frontend_process(
        nursery, "--engine", address, "--log-level", "debug"
    )
    # Said once the engine has stayed unreachable past the grace (a child engine binds a
    # moment after the frontend's first try: that is no news), after many attempts.
    await frontend.wait_for_output(r"WARNING.*is unreachable")
    assert frontend.output.count(rb"cannot connect: ConnectionRefusedError") > 5
    warnings = re.findall(rb"WARNING.*unreachable: ([^;]*); check that", frontend.output)
    assert warnings == [b"connection refused"]
    assert b"--engine names its host and port" in frontend.output
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        assert (await client.get("/health")).status_code == 503
        await start_mock_engine(nursery, address)
        await frontend.wait_for_output(r"WARNING.*engine tcp://127\.0\.0\.1:\d+: connected")
        await frontend.wait_for_output(r"engine tcp://127\.0\.0\.1:\d+ connected: id=")
        assert (await client.get("/health")).status_code == 200
    assert len(re.findall(rb"WARNING.*is unreachable", frontend.output)) == 1
    frontend.signal(signal.SIGINT)
    assert await frontend.wait() == 0

"""`trioserve client`: prints the answer as it streams, and Ctrl-C cancels cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
import trio

from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.engine_programs.mock import expected_text

pytestmark = pytest.mark.integration


async def run_client(*args: str) -> subprocess.CompletedProcess:
    return await trio.run_process(
        [sys.executable, "-m", "trioserve", "client", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


@pytest.mark.parametrize("transport", [[], ["--sse"]], ids=["websocket", "sse"])
async def test_prints_the_answer(frontend, transport):
    result = await run_client("Hello there", "--url", frontend.url, "--max-tokens", "6", *transport)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == expected_text("Hello there", 6) + "\n"


@pytest.mark.parametrize("transport", [[], ["--sse"]], ids=["websocket", "sse"])
async def test_reports_errors_in_one_line_with_a_nonzero_status(frontend, transport):
    result = await run_client("x", "--url", frontend.url, "--model", "nope", *transport)
    assert result.returncode == 1
    [line] = result.stderr.decode().splitlines()  # no empty line before it
    assert line.startswith("error") and "model_not_found" in line, result.stderr
    assert result.stdout == b""  # no answer began


@pytest.mark.parametrize("transport", [[], ["--sse"]], ids=["websocket", "sse"])
async def test_ctrl_c_cancels_the_request_and_the_engine_gets_its_abort(frontend, transport):
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioserve", "client", "go", "--url", frontend.url]
        + ["--max-tokens", "100000", *transport],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    with trio.fail_after(HANG_GUARD):
        first = await process.stdout.receive_some(1024)
    assert first  # tokens are flowing
    process.send_signal(signal.SIGINT)
    with trio.fail_after(HANG_GUARD):
        assert await process.wait() == 130
    await wait_until(lambda: not frontend.engine.core.running, "the engine to hold nothing")
    [ends] = list(frontend.engine.core.ends.values())
    assert ends == ["aborted"]


@pytest.mark.parametrize("transport", [[], ["--sse"]], ids=["websocket", "sse"])
async def test_a_server_that_is_down_is_a_sentence_not_a_traceback(transport):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # a port nobody listens on while the test runs
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        result = await run_client("x", "--url", url, *transport)
    assert result.returncode == 1
    assert result.stderr.decode().startswith(f"cannot reach {url}: "), result.stderr
    assert b"Traceback" not in result.stderr


async def test_a_url_without_its_scheme_is_taken_as_http(frontend):
    url = frontend.url.removeprefix("http://")
    result = await run_client("Hello there", "--url", url, "--max-tokens", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == expected_text("Hello there", 3) + "\n"

"""Tracing is optional: without ``--otlp-traces-endpoint`` a frontend serving requests
has imported nothing of OpenTelemetry (checked in a fresh interpreter, since the test
environment itself loads it: FastAPI does)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A frontend on a mock engine, in-process, answers one request; then prints whether any
# opentelemetry module is loaded.
SCRIPT = """
import sys
from functools import partial

import trio

from trioserve.config import Settings
from trioserve.engine_programs.mock import MockBackend
from trioserve.sdk import serve_engine
from trioserve.server.frontend import serve_frontend


async def main(endpoint):
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(partial(serve_engine, MockBackend(), "tcp://127.0.0.1:*"))
        settings = Settings(
            port=0, engines=[engine.address], drain_delay=0, graceful_timeout=1,
            otlp_traces_endpoint=endpoint,
        )
        app, drain, binds = await nursery.start(
            partial(serve_frontend, settings, handle_signals=False)
        )
        await app.services.engines.wait_ready()
        if not endpoint:
            host, port = binds[0].removeprefix("http://").rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            body = b'{"prompt": "hi", "max_tokens": 2, "stream": true}'
            await stream.send_all(
                b"POST /v1/completions HTTP/1.1\\r\\nhost: x\\r\\n"
                b"content-type: application/json\\r\\nconnection: close\\r\\n"
                b"content-length: %d\\r\\n\\r\\n%s" % (len(body), body)
            )
            answer = b""
            while chunk := await stream.receive_some():
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 ") and b"[DONE]" in answer, answer
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
        print("opentelemetry modules:", len(loaded))
        nursery.cancel_scope.cancel()


trio.run(main, sys.argv[1])
"""


@pytest.mark.parametrize(("endpoint", "loaded"), [("", False), ("http://127.0.0.1:9", True)])
def test_opentelemetry_is_imported_only_with_a_traces_endpoint(endpoint, loaded):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, endpoint],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    count = int(done.stdout.rsplit("opentelemetry modules:", 1)[1])
    assert (count > 0) is loaded, done.stdout

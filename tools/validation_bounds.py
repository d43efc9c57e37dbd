"""The worst request bodies within the default limits: how long each holds the event loop.

Serves a frontend in this process with the default settings (``--max-body-mb`` 128) in
front of ``trioserve engine mock`` (a subprocess), and sends it, one at a time from a
thread (so the sending costs the loop nothing), bodies built to cost it the most: huge
lists, every field wrong, as many JSON values as allowed, a body-sized string, a
body-sized base64 image. A task on the frontend's loop wakes every millisecond; the
longest gap between its wake-ups while a body is handled is the longest time that loop
did nothing else (heartbeats, other clients' tokens). Reports that and the answer's
status and time for each body.

    python -m tools.validation_bounds
"""

from __future__ import annotations

import base64
import http.client
import subprocess
import sys
import time
from collections.abc import Callable

import orjson
import trio

from trioserve.config import Settings
from trioserve.http.bodies.openai import MAX_CONTENT_PARTS, MAX_CONTENT_PARTS_TOTAL, MAX_MESSAGES
from trioserve.http.bodies.validation import MAX_JSON_COMMAS
from trioserve.server.frontend import serve_frontend

MAX_BODY = Settings().max_body_bytes
USER = {"role": "user", "content": "x"}


def body_sized_string() -> bytes:
    head, tail = b'{"max_tokens":1,"messages":[{"role":"user","content":"', b'"}]}'
    # One word: the mock engine splits the prompt into words (which is its cost, not ours).
    return head + b"a" * (MAX_BODY - len(head) - len(tail) - 64) + tail


def body_sized_image() -> bytes:
    # Base64 in 76-character lines: the lenient path (whitespace removed) is the slow one.
    head = b'{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"image_url",'
    head += b'"image_url":{"url":"data:image/png;base64,'
    tail = b'"}}]}]}'
    raw = bytes(range(256)) * ((MAX_BODY - len(head) - len(tail) - 4096) * 76 // 78 * 3 // 4 // 256)
    text = base64.b64encode(raw)
    lines = b"\\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    return head + lines + tail


BODIES: dict[str, Callable[[], bytes]] = {
    "issue 17: 300,000 {role: 5} (3.3 MB)": lambda: orjson.dumps(
        {"messages": [{"role": 5}] * 300_000}
    ),
    f"{MAX_MESSAGES} messages, each field wrong": lambda: orjson.dumps(
        {"messages": [{"role": 5, "name": 5, "content": 5}] * MAX_MESSAGES}
    ),
    f"{MAX_CONTENT_PARTS_TOTAL} content parts, each wrong": lambda: orjson.dumps(
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": 5}] * 256}]
            * (MAX_CONTENT_PARTS_TOTAL // MAX_CONTENT_PARTS)
        }
    ),
    f"{MAX_JSON_COMMAS} empty objects (the JSON values bound)": lambda: (
        b'{"messages":[' + b",".join([b"{}"] * MAX_JSON_COMMAS) + b"]}"
    ),
    f"{MAX_JSON_COMMAS + 1} zeros in an unknown field (refused unparsed)": lambda: (
        b'{"messages":[{"role":"user","content":"x"}],"pad":['
        + b",".join([b"0"] * (MAX_JSON_COMMAS + 1))
        + b"]}"
    ),
    f"{MAX_MESSAGES} valid messages of {MAX_CONTENT_PARTS_TOTAL} text parts": lambda: orjson.dumps(
        {
            "max_tokens": 1,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 2}]
            * MAX_MESSAGES,
        }
    ),
    "a 128 MiB prompt (valid: reaches the engine)": body_sized_string,
    "a 128 MiB base64 image in 76-character lines (valid)": body_sized_image,
}


def wait_healthy(port: int) -> None:
    """Until /health answers 200 (an engine a body made busy may have been lost)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("GET", "/health")
        if connection.getresponse().status == 200:
            return
        connection.close()
        time.sleep(0.1)
    raise SystemExit("the engine did not come back within 120 s")


def post(port: int, body: bytes) -> tuple[int, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response.status, time.perf_counter() - start


async def main() -> None:
    async with trio.open_nursery() as nursery:
        address = "ipc:///tmp/trioserve-validation-bounds.sock"
        engine = await trio.lowlevel.open_process(
            [sys.executable, "-m", "trioserve", "--log-level", "warning", "engine", "mock",
             "--bind", address, "--ttft-ms", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        settings = Settings(port=0, engines=[address], drain_delay=0.0)
        _, _, binds = await nursery.start(
            lambda task_status: serve_frontend(
                settings, handle_signals=False, engine_wait=10.0, task_status=task_status
            )
        )
        port = int(binds[0].rsplit(":", 1)[1])
        gaps: list[float] = []

        async def ticker() -> None:
            while True:
                before = time.perf_counter()
                await trio.sleep(0.001)
                gaps.append(time.perf_counter() - before - 0.001)

        nursery.start_soon(ticker)
        print(
            f"default max body {MAX_BODY / 2**20:g} MiB; longest event-loop stall per body:",
            flush=True,
        )
        try:
            await run_bodies(port, gaps)
        finally:
            engine.kill()
        nursery.cancel_scope.cancel()


async def run_bodies(port: int, gaps: list[float]) -> None:
    for name, build in BODIES.items():
        body = build()
        await trio.to_thread.run_sync(wait_healthy, port)
        await trio.sleep(0.2)
        gaps.clear()
        status, took = await trio.to_thread.run_sync(post, port, body)
        await trio.sleep(0.2)  # what the loop does right after (freeing the body)
        print(
            f"- {name}: {len(body) / 2**20:.1f} MiB, {status} in {took * 1000:.0f} ms, "
            f"loop stalled at most {max(gaps) * 1000:.0f} ms",
            flush=True,
        )


if __name__ == "__main__":
    trio.run(main)

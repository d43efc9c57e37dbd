"""A rolling restart of two frontends behind nginx under steady load (see
tests/process/test_rolling_restart.py and tests/vllm/test_rolling_restart_vllm.py)."""

from __future__ import annotations

import signal
from typing import Any

import attrs
import httpx
import trio

from tests.helpers.http import wait_health
from tests.helpers.nginx import open_nginx
from tests.helpers.processes import Proc, free_port
from tests.helpers.waiting import HANG_GUARD

#: What the test's nginx adds to its proxied location (docs/deployment.md shows the same).
LOCATION = """
            proxy_buffering off;
            proxy_read_timeout 60s;
            proxy_next_upstream error timeout http_503 non_idempotent;
"""


async def start_instance(nursery: trio.Nursery, engine: str, port: int, workers: int = 1) -> Proc:
    proc = await Proc.start(
        nursery,
        "run",
        "--engine",
        engine,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--drain-delay",
        "1",
        "--graceful-timeout",
        "20",
    )
    await proc.wait_for_output(rf"Running on http://127\.0\.0\.1:{port}", guard=3 * HANG_GUARD)
    return proc


@attrs.define
class Outcome:
    ok: int = 0
    streams_started: int = 0
    streams_completed: int = 0
    failures: list[str] = attrs.Factory(list)


async def roll_under_load(
    nursery: trio.Nursery, tmp_path: Any, engine: str, body: dict[str, Any], workers: int = 1
) -> Outcome:
    """Two `trioserve run --workers {workers}` instances on ``engine`` behind nginx; eight
    clients send ``body`` (completions, streamed or not, in turn) while each instance in
    turn gets SIGTERM and is replaced on its port once its listeners have closed. Returns
    what the clients saw."""
    port_a, port_b, port_lb = (free_port() for _ in range(3))
    instances = {port_a: await start_instance(nursery, engine, port_a, workers)}
    instances[port_b] = await start_instance(nursery, engine, port_b, workers)
    await wait_health(f"http://127.0.0.1:{port_a}")
    await wait_health(f"http://127.0.0.1:{port_b}")
    outcome = Outcome()
    failures = outcome.failures

    async with (
        open_nginx(tmp_path, port_lb, [port_a, port_b], LOCATION),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port_lb}", timeout=60) as client,
    ):
        await wait_health(client)
        stop = trio.Event()

        async def load(worker: int) -> None:
            i = 0
            while not stop.is_set():
                i += 1
                stream = (worker + i) % 2 == 0
                request = {**body, "prompt": f"w{worker}-{i}", "stream": stream}
                try:
                    if stream:
                        async with client.stream("POST", "/v1/completions", json=request) as r:
                            if r.status_code != 200:
                                failures.append(f"stream status {r.status_code}")
                                continue
                            outcome.streams_started += 1
                            text = "".join([chunk async for chunk in r.aiter_text()])
                        if text.endswith("data: [DONE]\n\n"):
                            outcome.streams_completed += 1
                            outcome.ok += 1
                        else:
                            failures.append(f"truncated stream: {text[-200:]!r}")
                    else:
                        r = await client.post("/v1/completions", json=request)
                        if r.status_code == 200 and r.json()["choices"][0]["finish_reason"]:
                            outcome.ok += 1
                        else:
                            failures.append(f"status {r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")

        async with trio.open_nursery() as clients:
            for worker in range(8):
                clients.start_soon(load, worker)
            await trio.sleep(0.5)
            for port in (port_a, port_b):
                old = instances[port]
                old.signal(signal.SIGTERM)
                # Every worker's listener closed: the port is free once the last one has.
                # (A worker with nothing in flight does not say so; it says it stops.)
                closed = "(listener closed|all connections closed)"
                await old.wait_for_output(
                    "(?s)" + "".join(rf"(?=.*\[worker {i}\][^\n]*{closed})" for i in range(workers))
                    if workers > 1
                    else closed
                )
                instances[port] = await start_instance(nursery, engine, port, workers)
                await wait_health(f"http://127.0.0.1:{port}")
                with trio.fail_after(40):
                    assert await old.process.wait() == 0
                await trio.sleep(0.5)
            stop.set()
    for proc in instances.values():
        proc.signal(signal.SIGTERM)
    return outcome

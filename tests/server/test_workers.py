"""The supervisor of ``--workers`` with stand-in workers (tiny Python processes), and its
parts: the socket group, the spec a worker reads, the restart budget.

The real workers (``trioserve run --workers N``) are in tests/process/test_workers.py.
"""

from __future__ import annotations

import errno
import io
import logging
import socket
import sys

import pytest
import trio
import trio.testing

from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.config import Settings
from trioserve.server import workers
from trioserve.server.workers import Supervisor, WorkerSpec, bind_group


def stand_in(code: str) -> list[str]:
    return [sys.executable, "-c", code]


#: Says it is ready, then fails.
CRASHES_AFTER_READY = "import os, sys; os.write(1, b'ready\\n'); sys.exit(3)"
#: Exits without ever being ready.
NEVER_READY = "import sys; sys.exit(3)"
#: Exits without reading its settings, its stdin closed first (a broken install).
DIES_AT_ONCE = "import os; os.close(0); os._exit(3)"
#: Still starting (never ready) until SIGTERM, which it obeys.
SLOW_TO_START = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
    "time.sleep(60)"
)


async def test_the_group_shares_one_port_and_refuses_a_port_something_listens_on():
    [[first], [second], [third]] = await bind_group("127.0.0.1", 0, 3)
    with first, second, third:
        port = first.getsockname()[1]
        assert second.getsockname()[1] == third.getsockname()[1] == port
        for sock in (first, second, third):
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        # Another group on the same port, though SO_REUSEPORT would let it in: refused.
        with pytest.raises(OSError) as caught:
            await bind_group("127.0.0.1", port, 2)
        assert caught.value.errno == errno.EADDRINUSE
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        with pytest.raises(OSError) as caught:
            await bind_group("127.0.0.1", plain.getsockname()[1], 2)
        assert caught.value.errno == errno.EADDRINUSE


def test_a_worker_reads_its_settings_whole_from_one_line():
    settings = Settings(port=0, engines=["tcp://127.0.0.1:5555"], api_keys=["k1", "k2"])
    spec = WorkerSpec(
        index=1,
        settings=settings,
        listen_fds=[7],
        engine_wait=10.0,
        metrics_dir="/tmp/x",
        log_level="debug",
    )
    stream = io.BytesIO(spec.to_json() + b"what follows is not read")
    assert WorkerSpec.read(stream) == spec
    assert stream.read() == b"what follows is not read"


async def test_restarts_within_the_window_are_bounded(autojump_clock):
    supervisor = Supervisor(Settings(), 2, [])
    for _ in range(workers.RESTART_LIMIT):
        assert supervisor._may_restart(0, 1234, -9)
        await trio.sleep(1)
    assert not supervisor._may_restart(0, 1234, -9)
    await trio.sleep(workers.RESTART_WINDOW)
    assert supervisor._may_restart(0, 1234, -9)


async def test_a_worker_that_keeps_dying_is_restarted_up_to_the_limit_then_all_stop(
    monkeypatch, caplog
):
    monkeypatch.setattr(workers, "RESTART_DELAY", 0.01)
    caplog.set_level(logging.INFO, "trioserve.workers")
    supervisor = Supervisor(Settings(port=0), 1, stand_in(CRASHES_AFTER_READY))
    with trio.fail_after(30):
        await supervisor.serve(handle_signals=False)
    assert supervisor.status == 1
    restarts = [r for r in caplog.messages if "restarting it" in r]
    assert len(restarts) == workers.RESTART_LIMIT
    assert "exited with 3; restarting it (restart 1 of at most" in restarts[0]
    assert any("giving up" in m for m in caplog.messages)
    assert supervisor.workers == {}


async def test_a_worker_that_never_starts_stops_the_others_and_closes_the_port(caplog):
    supervisor = Supervisor(Settings(port=0), 2, stand_in(NEVER_READY))
    with trio.fail_after(30):
        await supervisor.serve(handle_signals=False)
    assert supervisor.status == 1
    assert any("did not start" in m for m in caplog.messages)
    assert supervisor.workers == {}
    assert all(sock.fileno() == -1 for group in supervisor._sockets for sock in group)


async def test_a_signal_while_the_workers_start_stops_them_cleanly(nursery, caplog):
    caplog.set_level(logging.INFO, "trioserve.workers")
    supervisor = Supervisor(Settings(port=0), 2, stand_in(SLOW_TO_START))
    done = trio.Event()

    async def serve() -> None:
        await supervisor.serve(handle_signals=False)
        done.set()

    nursery.start_soon(serve)
    await wait_until(lambda: len(supervisor.workers) == 2, "both workers started")
    supervisor.drain()
    with trio.fail_after(HANG_GUARD):
        await done.wait()
    assert supervisor.status == 0
    assert not any("Running on" in m for m in caplog.messages)
    assert sum("stopped" in m for m in caplog.messages) == 2


async def test_a_worker_gone_before_it_read_its_settings_is_not_ready():
    supervisor = Supervisor(Settings(port=0), 1, stand_in(DIES_AT_ONCE))
    supervisor._sockets = [[]]  # (serve() binds them)
    process = await supervisor._spawn(0)
    with trio.fail_after(HANG_GUARD):
        await process.wait()
    assert not await supervisor._send_spec(0, process)  # EPIPE, not an exception

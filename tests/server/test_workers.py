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


async def test_restart_delays_double_per_exit_and_the_supervisor_gives_up_only_when_none_runs(
    autojump_clock,
):
    supervisor = Supervisor(Settings(), 2, [])
    supervisor.up = {1}  # worker 1 serves while worker 0 keeps dying
    delays = [supervisor._restart_delay(0, 1234, -9) for _ in range(workers.RESTART_LIMIT + 3)]
    assert delays[:3] == [workers.RESTART_DELAY * k for k in (1, 2, 4)]
    assert max(delays) == workers.MAX_RESTART_DELAY and None not in delays
    # Worker 1 dies too, once: worker 0 is crash-looping, but worker 1 can still run.
    supervisor.up = set()
    assert supervisor._restart_delay(1, 1235, 3) == workers.RESTART_DELAY
    for _ in range(workers.RESTART_LIMIT - 1):
        assert supervisor._restart_delay(1, 1235, 3) is not None
    # Now every worker has exited more than RESTART_LIMIT times in the window, none is up.
    assert supervisor._restart_delay(1, 1235, 3) is None
    # A window later, the exits are forgotten: back to the first delay.
    await trio.sleep(workers.RESTART_WINDOW)
    assert supervisor._restart_delay(0, 1234, -9) == workers.RESTART_DELAY


async def test_a_worker_that_keeps_dying_alone_is_restarted_then_the_supervisor_stops(
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
    assert "exited with 3; restarting it in 0.01 s (exit 1 in 60 s; 0 of 1" in restarts[0]
    assert any("giving up" in m for m in caplog.messages)
    assert supervisor.workers == {}


#: Worker 0 says it is ready, then dies; every other worker serves until SIGTERM.
ZERO_CRASHES = (
    "import json, os, signal, sys, time\n"
    "spec = json.loads(sys.stdin.readline())\n"
    "os.write(1, b'ready\\n')\n"
    "if spec['index'] == 0: sys.exit(3)\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "time.sleep(600)\n"
)


async def test_one_crash_looping_worker_leaves_the_others_serving_and_health_counts_them(
    nursery, monkeypatch, caplog
):
    monkeypatch.setattr(workers, "RESTART_DELAY", 0.01)
    caplog.set_level(logging.INFO, "trioserve.workers")
    supervisor = Supervisor(Settings(port=0), 2, stand_in(ZERO_CRASHES))
    done = trio.Event()

    async def serve() -> None:
        await supervisor.serve(handle_signals=False)
        done.set()

    nursery.start_soon(serve)
    exits = workers.RESTART_LIMIT + 3

    def restarted() -> bool:
        return sum("worker 0" in m and "restarting it" in m for m in caplog.messages) >= exits

    await wait_until(restarted, f"worker 0 restarted {exits} times")
    assert not done.is_set() and supervisor.status == 0
    assert supervisor.up == {1} and 1 in supervisor.workers
    up = workers.read_workers_up(supervisor._metrics_dir)
    assert up == {"up": 1, "count": 2}
    # While worker 0 waits to be restarted its sockets are closed: the kernel sends every
    # new connection to worker 1's.
    assert any("1 of 2 workers up" in m for m in caplog.messages)
    supervisor.drain()
    with trio.fail_after(HANG_GUARD):
        await done.wait()
    assert supervisor.status == 0


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

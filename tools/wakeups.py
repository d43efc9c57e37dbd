"""What this machine charges for waking a process: loopback round trips, busy and after idling.

The time a frontend adds to the first token is mostly hops between processes that were
idle while the engine worked (the client, the frontend, ZeroMQ's I/O threads). This tool
measures the floor those hops set on the machine at hand, without any frontend: a caller
and an echoing process (pinned to different cores where there are two) exchange one small
message at a time, first back to back, then after sleeping a gap before each one, over
loopback TCP and over ZeroMQ (DEALER to ROUTER, each side with its own I/O thread, as
engines speak); and over ZeroMQ again with the caller waiting for the reply as a pyzmq
socket's owner does in trio (``ZmqPump``: parked on the socket's descriptor), which adds
the cost of trio's run loop waking up. (trioserve's frontend speaks ZMTP itself, with no
I/O thread: ``src/trioserve/transport/zmtp.py``.) All traffic is on 127.0.0.1.

    python -m tools.wakeups                     # 300 round trips per cell
    python -m tools.wakeups --gaps 0,10 --count 50
    python -m tools.wakeups --write-docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import time
from typing import cast

import trio
import zmq

from tools.toolkit import processes, reports

BEGIN, END = "<!-- wakeups:begin -->", "<!-- wakeups:end -->"
TCP, ZMQ, ZMQ_TRIO = "TCP loopback", "ZeroMQ DEALER-ROUTER", "ZeroMQ, the caller parked in trio"
TRANSPORTS = (TCP, ZMQ, ZMQ_TRIO)
STOP = b"stop"


#: The echo's core and the caller's: two different ones when there are two (taken before
#: the caller pins itself).
_AVAILABLE = sorted(os.sched_getaffinity(0))
ECHO_CORE, CALLER_CORE = {_AVAILABLE[0]}, {_AVAILABLE[-1]}


def _echo_tcp(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (data := conn.recv(64)) and data != STOP:
        conn.sendall(data)


def _echo_zmq(port: int) -> None:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    while (frames := router.recv_multipart())[1] != STOP:
        router.send_multipart(frames)
    router.close(linger=0)
    context.term()


def round_trips(transport: str, gaps_ms: list[float], count: int, progress) -> dict:
    """Fork an echo, then time ``count`` round trips after each gap; p50/p99 in µs."""
    listener = None
    port = 0  # the echo's, for ZeroMQ
    if transport == TCP:
        listener = socket.create_server(("127.0.0.1", 0))
    else:
        port = processes.free_port()
    pid = os.fork()
    if pid == 0:  # the echo
        code = 0
        try:
            os.sched_setaffinity(0, ECHO_CORE)
            if listener is not None:
                _echo_tcp(listener)
            else:
                _echo_zmq(port)
        except BaseException:
            code = 1
        os._exit(code)
    os.sched_setaffinity(0, CALLER_CORE)
    context = None
    try:
        if listener is not None:
            sock = socket.create_connection(listener.getsockname(), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            send = sock.sendall

            async def receive() -> None:
                if not sock.recv(64):
                    raise RuntimeError("the echo closed the connection")

        else:
            context = zmq.Context()
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVTIMEO, 10_000)
            dealer.connect(f"tcp://127.0.0.1:{port}")
            send = dealer.send
            # pyzmq's stubs type every option as int | bytes; ZMQ_FD and ZMQ_EVENTS are ints.
            fd = cast(int, dealer.getsockopt(zmq.FD))

            async def receive() -> None:
                if transport == ZMQ:
                    dealer.recv()  # blocking: libzmq polls its own descriptor
                    return
                # As ZmqPump waits: parked on the (edge-triggered) descriptor.
                with trio.fail_after(10):
                    while not cast(int, dealer.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                        await trio.lowlevel.wait_readable(fd)
                dealer.recv(zmq.NOBLOCK)

        result = trio.run(_time, transport, send, receive, gaps_ms, count, progress)
        send(STOP)
    finally:
        if context is not None:
            context.destroy(linger=0)
        _, status = os.waitpid(pid, 0)
        if listener is not None:
            listener.close()
    if status != 0:
        raise RuntimeError(f"the {transport} echo failed")
    return result


async def _time(transport, send, receive, gaps_ms: list[float], count: int, progress) -> dict:
    """Round trips after each gap, p50/p99 in µs. The gaps sleep the whole thread (no
    trio run loop either); the reply wakes a blocking receive or trio's run loop."""
    for _ in range(20):  # connected, and both sides' code warm
        send(b"x")
        await receive()
    result = {}
    for gap in gaps_ms:
        progress(f"{transport}: {count} round trips, {gap:g} ms apart")
        rtts = []
        for _ in range(count):
            if gap:
                time.sleep(gap / 1000)  # noqa: ASYNC251  (idle the thread, run loop too)
            start = time.perf_counter()
            send(b"x")
            await receive()
            rtts.append(time.perf_counter() - start)
        rtts.sort()
        result[f"{gap:g}"] = {
            "p50_us": statistics.median(rtts) * 1e6,
            "p99_us": rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))] * 1e6,
        }
    return result


def table(results: dict, gaps_ms: list[float], count: int, command: str) -> str:
    pinning = (
        f"the echo on core {min(ECHO_CORE)}, the caller on core {min(CALLER_CORE)}"
        if ECHO_CORE != CALLER_CORE
        else "both on one core (only one available)"
    )
    head = " | ".join("back to back" if not gap else f"after {gap:g} ms idle" for gap in gaps_ms)
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
        f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}, "
        f"Python {platform.python_version()}, with `{command}`: {count} round trips of one "
        f"small message per cell, {pinning}.",
        "",
        f"| round trip, p50 (p99), µs | {head} |",
        "|---" * (len(gaps_ms) + 1) + "|",
    ]
    for transport in TRANSPORTS:
        cells = " | ".join(
            "{p50_us:,.0f} ({p99_us:,.0f})".format(**results[transport][f"{gap:g}"])
            for gap in gaps_ms
        )
        lines.append(f"| {transport} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.wakeups", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--count", type=int, default=300, help="round trips per cell")
    parser.add_argument("--gaps", default="0,5,10", help="idle ms before each round trip")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--write-docs", help="replace the table between the markers here")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    gaps_ms = [float(x) for x in args.gaps.split(",") if x]
    command = f"python -m tools.wakeups --count {args.count} --gaps {args.gaps}"

    def progress(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)

    results = {t: round_trips(t, gaps_ms, args.count, progress) for t in TRANSPORTS}
    text = table(results, gaps_ms, args.count, command)
    reports.publish(text, command, results, args.json, args.write_docs, BEGIN, END)


if __name__ == "__main__":
    main()

"""What hostile clients make a running frontend hold, and what that does to other clients.

Starts ``trioserve run`` (the built-in mock engine, or ``--server hypercorn``) with the
flags a scenario names, on 127.0.0.1, and runs that scenario's clients against it from
threads of this process. Reports the frontend's RSS (``/proc/PID/status``: the ``trioserve
run`` process only, not its mock engine) before, at its highest while the clients hold on,
and after; the answers the hostile clients got; and the p50 of another client's ``GET
/live`` on a keep-alive connection meanwhile, beside the p50 measured before they started.

Scenarios (issue 27's findings):

- ``chunked``: 10 connections without an API key (``--api-key`` is set) send a chunked
  body in 2-byte chunks (1 MiB of payload each), then hold; a 401 should come first.
- ``multipart``: 4 ``/generate`` uploads with 1 MiB form fields (not files), 96 of them,
  stalled before the closing boundary, under ``--max-body-memory-mb 64``; then a 10 MiB
  JSON body.
- ``ws-empty``: one WebSocket sends a text frame without FIN, then 60 MiB of empty
  continuation frames.
- ``ws-loop``: three WebSockets keep sending empty continuation frames for 5 s.
- ``ws-deflate``: (``--server hypercorn``) 40 WebSockets negotiate permessage-deflate and
  each sends one 64 KiB frame that inflates to 64 MiB.
- ``ws-schema``: the messages of the schema finding (an ``endpoint`` that is a list or an
  object, a ping ``id`` nested 1,000 deep, ...): what each gets back.

    python -m tools.hostile_clients chunked multipart ws-empty ws-loop ws-deflate ws-schema
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from tools.raw_clients import (
    answer_of,
    close_code,
    connect,
    ws_frame,
    ws_open,
    ws_open_negotiated,
    ws_read_frames,
)

KEY = "hostile-clients-key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Frontend:
    def __init__(self, *flags: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trioserve",
                "--log-level",
                "warning",
                "run",
                "--port",
                str(self.port),
                "--drain-delay",
                "0",
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.stderr = b""
        threading.Thread(target=self._read_stderr, daemon=True).start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # interrupted (SIGTERM) or never ready: nothing left running
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if get(self.port, "/health")[0] == 200:
                    return
            except OSError:
                pass
            if self.process.poll() is not None:
                raise SystemExit(f"trioserve run exited: {self.stderr.decode()[-2000:]}")
            time.sleep(0.1)
        raise SystemExit("the frontend did not become ready within 60 s")

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr += line

    def rss(self) -> float:
        return rss_mib(self.process.pid)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        try:
            os.killpg(self.process.pid, 9)  # its mock engine
        except ProcessLookupError:
            pass


def get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


class LiveProbe:
    """``GET /live`` on one keep-alive connection, as fast as it is answered (with a short
    pause between), from a thread; the latencies of each phase."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                connection.request("GET", "/live")
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            if ok:
                self.samples.append(time.perf_counter() - start)
            else:
                self.failures += 1
            time.sleep(0.005)
        connection.close()

    def __enter__(self) -> LiveProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def p50_ms(self) -> float:
        return statistics.median(self.samples) * 1000 if self.samples else float("nan")


def baseline_live_p50(port: int, seconds: float = 2.0) -> float:
    with LiveProbe(port) as probe:
        time.sleep(seconds)
    return probe.p50_ms()


def hold_while(frontend: Frontend, seconds: float) -> float:
    """The highest RSS over ``seconds``."""
    peak = frontend.rss()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, frontend.rss())
        time.sleep(0.1)
    return peak


# -- scenarios ---------------------------------------------------------------------------


def chunked(server: list[str]) -> None:
    frontend = Frontend(*server, "--api-key", KEY)
    try:
        live = baseline_live_p50(frontend.port)
        before = frontend.rss()
        socks = []
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        payload = b"2\r\nab\r\n" * (512 * 1024)  # 1 MiB of body in 2-byte chunks
        answered_early = 0
        with LiveProbe(frontend.port) as probe:
            for _ in range(10):
                sock = connect(frontend.port)
                sock.sendall(head)
                try:
                    sock.sendall(payload)
                except OSError:
                    pass  # the server answered and closed: what should happen
                socks.append(sock)
            peak = hold_while(frontend, 3)
            for sock in socks:
                if answer_of(sock, 0.5).startswith(b"HTTP/1.1 401"):
                    answered_early += 1
        for sock in socks:
            sock.close()
        time.sleep(0.5)
        report(
            "chunked: 10 keyless chunked bodies of 1 MiB in 2-byte chunks, held",
            before,
            peak,
            frontend.rss(),
            live,
            probe,
            f"{answered_early}/10 answered 401 before closing",
        )
    finally:
        frontend.stop()


def multipart_body(boundary: bytes, fields: int, field_bytes: int) -> bytes:
    part = (
        b"--"
        + boundary
        + b'\r\ncontent-disposition: form-data; name="f%d"\r\n\r\n'
        + b"v" * field_bytes
        + b"\r\n"
    )
    return b"".join(part.replace(b"%d", str(i).encode()) for i in range(fields))


def multipart(server: list[str]) -> None:
    frontend = Frontend(*server, "--max-body-memory-mb", "64")
    try:
        live = baseline_live_p50(frontend.port)
        before = frontend.rss()
        boundary = b"hostileboundary"
        body = multipart_body(boundary, 96, 1024 * 1024)
        head = (
            b"POST /generate HTTP/1.1\r\nhost: x\r\n"
            b"content-type: multipart/form-data; boundary=" + boundary + b"\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        socks, refused = [], 0
        with LiveProbe(frontend.port) as probe:
            for _ in range(4):
                sock = connect(frontend.port)
                sock.sendall(head)
                try:
                    for offset in range(0, len(body), 1 << 20):
                        piece = body[offset : offset + (1 << 20)]
                        sock.sendall(b"%x\r\n%b\r\n" % (len(piece), piece))
                except OSError:
                    pass
                socks.append(sock)
            peak = hold_while(frontend, 3)
            json_body = json.dumps({"prompt": "x" * (10 << 20), "max_tokens": 1}).encode()
            connection = http.client.HTTPConnection("127.0.0.1", frontend.port, timeout=60)
            connection.request("POST", "/generate", json_body, {"content-type": "application/json"})
            response = connection.getresponse()
            json_status = response.status
            response.read()
            connection.close()
            for sock in socks:
                if answer_of(sock, 0.5)[:12] in (b"HTTP/1.1 503", b"HTTP/1.1 413"):
                    refused += 1
        for sock in socks:
            sock.close()
        time.sleep(0.5)
        report(
            "multipart: 4 stalled uploads of 96 1-MiB form fields, --max-body-memory-mb 64",
            before,
            peak,
            frontend.rss(),
            live,
            probe,
            f"{refused}/4 uploads refused; then a 10 MiB JSON body: {json_status}",
        )
    finally:
        frontend.stop()


def ws_empty(server: list[str]) -> None:
    frontend = Frontend(*server)
    try:
        live = baseline_live_p50(frontend.port)
        before = frontend.rss()
        with LiveProbe(frontend.port) as probe:
            sock = ws_open(frontend.port)
            sock.sendall(ws_frame(1, b"x", fin=False))
            empty = ws_frame(0, b"", fin=False) * 10000  # 60,000 bytes
            sent = 0
            sock.settimeout(10.0)
            deadline = time.monotonic() + 20  # what it sends within 20 s, at most 60 MiB
            try:
                while sent < 60 << 20 and time.monotonic() < deadline:
                    sock.sendall(empty)
                    sent += len(empty)
            except OSError:
                pass
            peak = hold_while(frontend, 2)
            code = close_code(ws_read_frames(sock, 1.0))
            sock.close()
        report(
            "ws-empty: one text frame without FIN, then 60 MiB of empty continuations",
            before,
            peak,
            frontend.rss(),
            live,
            probe,
            f"{sent / 2**20:.0f} MiB sent; close code {code}",
        )
    finally:
        frontend.stop()


def ws_loop(server: list[str]) -> None:
    frontend = Frontend(*server)
    try:
        live = baseline_live_p50(frontend.port)
        before = frontend.rss()
        stop = threading.Event()
        codes: list[int | None] = []

        def flood() -> None:
            try:
                sock = ws_open(frontend.port)
            except OSError:
                return
            sock.settimeout(10.0)
            try:
                while not stop.is_set():
                    # A fresh message each time: each stays under the message limit.
                    sock.sendall(ws_frame(1, b"x", fin=False) + ws_frame(0, b"", fin=False) * 5000)
                    sock.sendall(ws_frame(0, b"", fin=True))
            except OSError:
                pass
            codes.append(close_code(ws_read_frames(sock, 0.5)))
            sock.close()

        with LiveProbe(frontend.port) as probe:
            threads = [threading.Thread(target=flood) for _ in range(3)]
            for thread in threads:
                thread.start()
            peak = hold_while(frontend, 5)
            stop.set()
            for thread in threads:
                thread.join()
        report(
            "ws-loop: 3 WebSockets sending empty continuation frames for 5 s",
            before,
            peak,
            frontend.rss(),
            live,
            probe,
            f"close codes {codes}",
        )
    finally:
        frontend.stop()


#: WebSockets of the ws-deflate scenario (``--deflate-sockets``).
DEFLATE_SOCKETS = [40]


def ws_deflate(server: list[str]) -> None:
    count = DEFLATE_SOCKETS[0]
    frontend = Frontend(*(server or ["--server", "hypercorn"]))
    try:
        live = baseline_live_p50(frontend.port)
        before = frontend.rss()
        compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
        bomb = compressor.compress(b"a" * (64 << 20)) + compressor.flush(zlib.Z_SYNC_FLUSH)
        bomb = bomb[:-4]  # permessage-deflate drops the trailing 00 00 ff ff
        negotiated, codes, socks = 0, [], []
        with LiveProbe(frontend.port) as probe:
            for _ in range(count):
                sock, agreed = ws_open_negotiated(frontend.port, deflate=True)
                negotiated += agreed
                try:
                    sock.sendall(ws_frame(1, bomb, rsv1=True))
                except OSError:
                    pass
                socks.append(sock)
            peak = hold_while(frontend, 3)
            for sock in socks:
                codes.append(close_code(ws_read_frames(sock, 0.2)))
                sock.close()
        time.sleep(0.5)
        report(
            f"ws-deflate: {count} WebSockets, one {len(bomb) >> 10} KiB frame inflating to 64 MiB",
            before,
            peak,
            frontend.rss(),
            live,
            probe,
            f"deflate negotiated on {negotiated}/{count}; close codes {set(codes)}",
        )
    finally:
        frontend.stop()


SCHEMA_MESSAGES = {
    "endpoint a list": {"type": "request", "id": "a", "endpoint": [], "body": {}},
    "endpoint an object": {"type": "request", "id": "a", "endpoint": {}, "body": {}},
    "ping id nested 1,000 deep": "NESTED",
    "type a list": {"type": [], "id": "a"},
    "body a list": {"type": "request", "id": "a", "endpoint": "completions", "body": []},
    "timeout an object": {
        "type": "request",
        "id": "a",
        "endpoint": "completions",
        "body": {"prompt": "x"},
        "timeout": {},
    },
    "traceparent a list": {
        "type": "request",
        "id": "a",
        "endpoint": "completions",
        "body": {"prompt": "x", "max_tokens": 1},
        "traceparent": [],
    },
}


def ws_schema(server: list[str]) -> None:
    frontend = Frontend(*server)
    try:
        print("ws-schema: what each message gets (a running request on the same socket)")
        for name, message in SCHEMA_MESSAGES.items():
            sock = ws_open(frontend.port)
            running = {
                "type": "request",
                "id": "long",
                "endpoint": "completions",
                "body": {"prompt": "x", "max_tokens": 10000},
            }
            sock.sendall(ws_frame(1, json.dumps(running).encode()))
            text = (
                '{"type":"ping","id":' + "[" * 1000 + "]" * 1000 + "}"
                if message == "NESTED"
                else json.dumps(message)
            )
            sock.sendall(ws_frame(1, text.encode()))
            frames = ws_read_frames(sock, 1.0)
            events = [json.loads(p) for op, p in frames if op == 1]
            kinds = [(e["type"], e.get("id"), (e.get("error") or {}).get("code")) for e in events]
            print(f"  {name}: close {close_code(frames)}, events {kinds[:4]}", flush=True)
            sock.close()
        tracebacks = frontend.stderr.count(b"Traceback")
        print(f"  tracebacks in the frontend's log: {tracebacks}")
    finally:
        frontend.stop()


def report(
    name: str, before: float, peak: float, after: float, live: float, probe: LiveProbe, note: str
) -> None:
    print(
        f"{name}\n  RSS {before:.0f} MiB before, {peak:.0f} MiB at most ({peak - before:+.0f}), "
        f"{after:.0f} MiB after; other client's /live p50 {live:.2f} ms before, "
        f"{probe.p50_ms():.2f} ms meanwhile ({len(probe.samples)} answered, "
        f"{probe.failures} failed)\n  {note}",
        flush=True,
    )


SCENARIOS: dict[str, Callable[[list[str]], None]] = {
    "chunked": chunked,
    "multipart": multipart,
    "ws-empty": ws_empty,
    "ws-loop": ws_loop,
    "ws-deflate": ws_deflate,
    "ws-schema": ws_schema,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.hostile_clients", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--server", choices=("builtin", "hypercorn"), default=None)
    parser.add_argument("--deflate-sockets", type=int, default=DEFLATE_SOCKETS[0])
    args = parser.parse_args()
    # A SIGTERM (timeout(1), a CI job's end) unwinds, so every frontend started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    DEFLATE_SOCKETS[0] = args.deflate_sockets
    server = ["--server", args.server] if args.server else []
    for name in args.scenarios:
        SCENARIOS[name](server)


if __name__ == "__main__":
    main()

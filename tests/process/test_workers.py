"""`trioserve run --workers N`: one port, N frontend processes, one supervisor.

Which worker serves a connection is read from the kernel (/proc: which process holds the
accepted socket), so the tests know each worker answered without the server saying so.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.processes import Proc, free_port, start_engine_process, start_frontend_process
from tests.helpers.rolling import roll_under_load
from tests.helpers.waiting import HANG_GUARD
from trioserve.cli import ENVIRONMENT_ERROR, build_parser

pytestmark = pytest.mark.integration

#: Connections opened, at most, to find one that each worker accepted.
MAX_PROBES = 64


class Connection:
    """A keep-alive HTTP/1.1 connection, requests sent by hand (so a test knows which
    connection, and so which worker, each request went to)."""

    def __init__(self, stream: trio.SocketStream, host: str, port: int) -> None:
        self.stream = stream
        self.host, self.port = host, port
        self.buffer = b""

    @classmethod
    async def open(cls, url: str) -> Connection:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)), host, int(port))

    @property
    def local_port(self) -> int:
        return self.stream.socket.getsockname()[1]

    async def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        """One request, its whole (Content-Length) response."""
        payload = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\n"
        if body is not None:
            head += f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
        await self.stream.send_all(head.encode() + b"\r\n" + payload)
        with trio.fail_after(HANG_GUARD):
            while b"\r\n\r\n" not in self.buffer:
                await self._fill()
            head_bytes, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            status = int(head_bytes[9:12])
            length = int(re.search(rb"(?i)content-length: (\d+)", head_bytes).group(1))
            while len(self.buffer) < length:
                await self._fill()
        body_bytes, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, body_bytes

    async def stream_completion(self, max_tokens: int) -> bytes:
        """A streamed completion, read to the end of the response (chunked SSE)."""
        payload = json.dumps({"prompt": "w", "max_tokens": max_tokens, "stream": True}).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nhost: {self.host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
        )
        await self.stream.send_all(head.encode() + payload)
        with trio.fail_after(HANG_GUARD):
            while not self.buffer.endswith(b"\r\n0\r\n\r\n"):
                if not await self._fill():
                    break
        data, self.buffer = self.buffer, b""
        return data

    async def _fill(self) -> bool:
        chunk = await self.stream.receive_some(65536)
        self.buffer += chunk
        return bool(chunk)

    async def aclose(self) -> None:
        await self.stream.aclose()


def owner(port: int, client_port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` holds the server side of the connection from ``client_port`` to
    ``port`` on 127.0.0.1 (None: none of them, or not accepted yet)."""
    local = f"0100007F:{port:04X}"
    remote = f"0100007F:{client_port:04X}"
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            inode = fields[9]
    if inode is None or inode == "0":
        return None
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
                except OSError:
                    continue
        except OSError:
            continue
    return None


async def one_connection_per_worker(url: str, pids: list[int]) -> dict[int, Connection]:
    """Open connections (each answers one /live first, so it has been accepted) until
    each worker holds one; the others are closed."""
    port = int(url.rsplit(":", 1)[1])
    found: dict[int, Connection] = {}
    spare: list[Connection] = []
    try:
        for _ in range(MAX_PROBES):
            connection = await Connection.open(url)
            assert (await connection.request("GET", "/live"))[0] == 200
            pid = owner(port, connection.local_port, pids)
            assert pid is not None, "an answered connection must belong to a worker"
            if pid in found:
                spare.append(connection)
            else:
                found[pid] = connection
            if len(found) == len(pids):
                return found
        raise AssertionError(f"{MAX_PROBES} connections all went to {list(found)} of {pids}")
    finally:
        for connection in spare:
            await connection.aclose()


async def start_workers(
    nursery: trio.Nursery, count: int, *args: str
) -> tuple[Proc, str, list[int]]:
    """``trioserve run --workers count`` with its own mock engine; returns the process, its
    URL and the workers' pids (by index)."""
    frontend, url = await start_frontend_process(
        nursery,
        "--workers",
        str(count),
        "--mock-tokens-per-second",
        "200",
        "--mock-ttft-ms",
        "2",
        *args,
    )
    return frontend, url, worker_pids(frontend, count)


def worker_pids(frontend: Proc, count: int) -> list[int]:
    """The pid each worker index was last started with."""
    started = re.findall(rb"started worker (\d+) \(pid (\d+)\)", frontend.output)
    pids = {int(index): int(pid) for index, pid in started}
    assert sorted(pids) == list(range(count))
    return [pids[i] for i in range(count)]


def metric(text: bytes, sample: str) -> float:
    """The sum of the samples named as ``sample`` says (``name`` or ``name{label="v",...}``,
    the labels a subset of each sample's: in any order, others summed over)."""
    name, _, wanted = sample.partition("{")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', wanted))
    found = [
        s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    assert found, f"{sample} not in /metrics"
    return sum(found)


async def scrape(connection: Connection) -> bytes:
    status, text = await connection.request("GET", "/metrics")
    assert status == 200
    return text


async def wait_for_metric(connection: Connection, name: str, value: float) -> bytes:
    """Scrape until ``name`` is ``value`` (a request is counted just after its response
    has left, maybe after the client's next request reached another worker)."""
    with trio.fail_after(HANG_GUARD):
        while metric(text := await scrape(connection), name) != value:
            await trio.sleep(0.02)
    return text


async def wait_in_flight(connection: Connection, count: int) -> None:
    await wait_for_metric(connection, "trioserve_requests_in_flight", count)


COMPLETED = 'trioserve_requests_total{outcome="completed"}'
SMALL = {"prompt": "count me", "max_tokens": 2}


async def test_two_workers_share_one_port_one_mock_engine_and_metrics_sum_over_both(nursery):
    frontend, url, pids = await start_workers(nursery, 2)
    assert len(re.findall(rb"started the mock engine", frontend.output)) == 1
    connections = await one_connection_per_worker(url, pids)
    # Different numbers on each, so that a sum cannot pass for either worker's count.
    sent = {pids[0]: 3, pids[1]: 5}
    for pid, count in sent.items():
        for _ in range(count):
            status, body = await connections[pid].request("POST", "/v1/completions", SMALL)
            assert status == 200, body
    for connection in connections.values():
        text = await wait_for_metric(connection, COMPLETED, 8)
        # The histograms, which each worker counts in its own memory and writes for the
        # others every half second, summed too.
        for histogram in ("time_to_first_token", "request_duration"):
            text = await wait_for_metric(connection, f"trioserve_{histogram}_seconds_count", 8)
        assert metric(text, 'trioserve_time_to_first_token_seconds_bucket{le="+Inf"}') == 8
        assert metric(text, "trioserve_worker_starts_total") == 2
        assert metric(text, "trioserve_draining") == 0
        [engine] = re.findall(rb'trioserve_engine_connected\{engine="([^"]+)"\} 1.0', text)
        assert engine.startswith(b"ipc://")
        await connection.aclose()


async def test_in_flight_requests_are_summed_over_the_workers(nursery):
    _, url, pids = await start_workers(nursery, 2, "--mock-tokens-per-second", "5")
    connections = await one_connection_per_worker(url, pids)
    probe = await Connection.open(url)
    async with trio.open_nursery() as streams:
        for connection in connections.values():
            streams.start_soon(connection.stream_completion, 15)  # 3 s each
        await wait_in_flight(probe, 2)
    await wait_in_flight(probe, 0)
    await wait_for_metric(probe, COMPLETED, 2)


def tokens(response: bytes) -> list[str]:
    """A streamed completion's texts in order, then ``[DONE]`` or ``error:CODE``."""
    head, _, body = response.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], head
    sse = b""
    while body:  # the chunked framing
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        sse, body = sse + body[:size], body[size + 2 :]
    out = []
    for event in sse.split(b"\n\n"):
        if not event.startswith(b"data: "):
            continue
        data = event.removeprefix(b"data: ")
        if data == b"[DONE]":
            out.append("[DONE]")
        elif "error" in (parsed := json.loads(data)):
            out.append(f"error:{parsed['error']['code']}")
        elif parsed["choices"][0]["text"]:
            out.append(parsed["choices"][0]["text"])
    return out


async def test_sigterm_drains_every_worker_and_their_streams_complete(nursery):
    frontend, url, pids = await start_workers(
        nursery, 2, "--mock-tokens-per-second", "10", "--drain-delay", "0.5"
    )
    connections = await one_connection_per_worker(url, pids)
    results: dict[int, bytes] = {}

    async def stream(pid: int) -> None:
        results[pid] = await connections[pid].stream_completion(20)  # 2 s at 10 tokens/s

    probe = await Connection.open(url)
    async with trio.open_nursery() as streams:
        for pid in pids:
            streams.start_soon(stream, pid)
        await wait_in_flight(probe, 2)
        await probe.aclose()
        frontend.signal(signal.SIGTERM)
        for index in range(2):
            await frontend.wait_for_output(rf"\[worker {index}\]: draining: readiness is now 503")
    for pid in pids:
        events = tokens(results[pid])
        assert len(events) == 21 and events[-1] == "[DONE]", results[pid]
    assert await frontend.wait() == 0
    for index, pid in enumerate(pids):
        assert f"worker {index} (pid {pid}) stopped".encode() in frontend.output
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    await frontend.wait_for_output(r"mock engine stopped \(exit code 0\)")


async def test_a_second_sigterm_ends_every_workers_streams_at_once(nursery):
    frontend, url, pids = await start_workers(
        nursery, 2, "--drain-delay", "600", "--graceful-timeout", "600"
    )
    connections = await one_connection_per_worker(url, pids)
    results: dict[int, bytes] = {}

    async def stream(pid: int) -> None:
        results[pid] = await connections[pid].stream_completion(1_000_000)

    probe = await Connection.open(url)
    async with trio.open_nursery() as streams:
        for pid in pids:
            streams.start_soon(stream, pid)
        await wait_in_flight(probe, 2)
        frontend.signal(signal.SIGTERM)
        for index in range(2):
            await frontend.wait_for_output(rf"\[worker {index}\]: draining: readiness is now 503")
        assert (await probe.request("GET", "/health"))[0] == 503
        assert (await probe.request("GET", "/live"))[0] == 200
        frontend.signal(signal.SIGTERM)
    for pid in pids:
        assert tokens(results[pid])[-1] == "error:server_shutting_down"
    assert await frontend.wait() == 0


async def test_sigint_reaches_every_worker_as_sigint_and_skips_the_drain_delay(nursery):
    # A drain delay no test outlives: only a SIGINT that reached the workers as one ends it.
    frontend, _, pids = await start_workers(nursery, 2, "--drain-delay", "600")
    frontend.signal(signal.SIGINT)
    assert await frontend.wait() == 0
    for index in range(2):
        # (As a single process says a Ctrl-C with nothing in flight; a SIGTERM would have
        # begun the drain delay.)
        assert f"[worker {index}]: Ctrl-C: nothing in flight; stopping".encode() in frontend.output
    for index, pid in enumerate(pids):
        assert f"worker {index} (pid {pid}) stopped".encode() in frontend.output


async def test_every_log_line_says_which_worker_wrote_it_in_json_too(nursery):
    frontend, url, pids = await start_workers(nursery, 2, "--log-format", "json")
    connections = await one_connection_per_worker(url, pids)
    for connection in connections.values():
        assert (await connection.request("POST", "/v1/completions", SMALL))[0] == 200
    await frontend.wait_for_output('"logger": "trioserve.access", "worker": 1')
    await frontend.wait_for_output('"logger": "trioserve.access", "worker": 0')
    for line in frontend.output.splitlines():
        entry = json.loads(line)  # every line, the supervisor's too, is JSON
        if entry["logger"] == "trioserve.access":
            assert entry["worker"] in (0, 1)


async def test_a_killed_worker_is_restarted_and_the_port_keeps_serving(nursery):
    frontend, url, pids = await start_workers(nursery, 2)
    connections = await one_connection_per_worker(url, pids)
    for _ in range(4):
        assert (await connections[pids[0]].request("POST", "/v1/completions", SMALL))[0] == 200
    # A request is counted once its response has left: wait for the count before the kill.
    await wait_for_metric(connections[pids[0]], COMPLETED, 4)
    os.kill(pids[0], signal.SIGKILL)
    # The port never stops serving: every new connection is answered (by the survivor,
    # until the replacement accepts too).
    for _ in range(10):
        connection = await Connection.open(url)
        assert (await connection.request("POST", "/v1/completions", SMALL))[0] == 200
        await connection.aclose()
    await frontend.wait_for_output(
        rf"worker 0 \(pid {pids[0]}\) was killed by SIGKILL; restarting it in [\d.]+ s \(exit 1 "
    )
    started = await frontend.wait_for_output(rf"started worker 0 \(pid (?!{pids[0]}\))(\d+)\)")
    replacement = int(started.group(1))
    await frontend.wait_for_output(rf"worker 0 \(pid {replacement}\) accepting")
    assert worker_pids(frontend, 2) == [replacement, pids[1]]
    survivor = pids[1]
    connections = await one_connection_per_worker(url, [replacement, survivor])
    # The dead worker's counts stay in the sum; its gauges left with it.
    text = await wait_for_metric(connections[replacement], COMPLETED, 14)
    assert metric(text, "trioserve_worker_starts_total") == 3
    assert metric(text, "trioserve_draining") == 0
    frontend.signal(signal.SIGTERM)
    assert await frontend.wait() == 0


async def test_workers_drain_by_themselves_when_the_supervisor_is_killed(nursery):
    frontend, _, pids = await start_workers(nursery, 2, "--drain-delay", "0.2")
    frontend.signal(signal.SIGKILL)
    with trio.fail_after(HANG_GUARD):
        for pid in pids:
            while _running(pid):
                await trio.sleep(0.05)
    await frontend.wait_for_output("(?s)the supervisor is gone; draining.*the supervisor is gone")


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (an orphan's new parent may not reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_workers_on_hypercorn(nursery):
    _, url, pids = await start_workers(nursery, 2, "--server", "hypercorn")
    connections = await one_connection_per_worker(url, pids)
    for connection in connections.values():
        assert (await connection.request("POST", "/v1/completions", SMALL))[0] == 200
    await wait_for_metric(connections[pids[0]], COMPLETED, 2)


async def test_workers_on_a_port_in_use_are_refused_with_one_line(nursery):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        frontend = await Proc.start(
            nursery, "run", "--workers", "2", "--port", str(port), "--engine", "tcp://127.0.0.1:9"
        )
        assert await frontend.wait() == ENVIRONMENT_ERROR
    assert f"cannot listen on 127.0.0.1 port {port}: Address already in use".encode() in (
        frontend.output
    )
    assert b"Traceback" not in frontend.output
    assert b"started worker" not in frontend.output


@pytest.mark.parametrize("count", ["0", "-1", "two"])
def test_workers_must_be_a_positive_number(count, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["run", "--workers", count])
    assert exited.value.code == 2
    assert "--workers" in capsys.readouterr().err


async def test_a_rolling_restart_of_workers_through_nginx_drops_nothing(nursery, tmp_path, nginx):
    engine_port = free_port()
    await start_engine_process(nursery, engine_port)
    outcome = await roll_under_load(
        nursery, tmp_path, f"tcp://127.0.0.1:{engine_port}", {"max_tokens": 20}, workers=2
    )
    assert not outcome.failures, outcome.failures[:10]
    assert outcome.streams_started == outcome.streams_completed > 0
    assert outcome.ok > 50

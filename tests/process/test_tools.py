"""Smoke runs of the measuring tools (seconds, no thresholds), so they cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from tests.helpers.waiting import HANG_GUARD
from tools.bench_plan import markers
from tools.toolkit.processes import ROOT, tool_command
from tools.toolkit.reports import write_docs

pytestmark = pytest.mark.integration


def run_tool(name: str, out: Path, *args: str, timeout: float) -> str:
    """Run ``python -m tools.<name>`` quietly with its figures written to ``out``; its
    stdout."""
    result = subprocess.run(
        [*tool_command(name), *args, "--quiet", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_abort_latency_tool_runs_and_reports_both_kinds(tmp_path):
    out = tmp_path / "figures.json"
    stdout = run_tool("abort_latency", out, "--count", "3", timeout=120)
    assert "| streaming (SSE) | 3 |" in stdout
    assert "| non-streaming (JSON) | 3 |" in stdout
    assert out.exists()


def test_instruction_count_tool_runs_and_reports_both_frontends(tmp_path):
    out = tmp_path / "figures.json"
    args = ("--requests", "6", "--warmup", "2", "--concurrency", "2")
    stdout = run_tool("instructions", out, *args, timeout=600)
    assert "| non-streaming (JSON), 16 tokens |" in stdout
    assert "| streaming (SSE), 16 tokens |" in stdout
    figures = json.loads(out.read_text())["results"]
    assert set(figures) == {"trioserve", "reference"}


def test_instruction_count_tool_measures_the_direct_vllm_path(tmp_path):
    out = tmp_path / "figures.json"
    args = ("--direct-vllm", "--requests", "4", "--warmup", "2", "--concurrency", "2")
    stdout = run_tool("instructions", out, *args, "--step-ms", "50", timeout=600)
    assert "| non-streaming (JSON), 16 tokens |" in stdout
    figures = json.loads(out.read_text())["results"]
    assert set(figures) == {"trioserve direct"}
    assert all(count > 0 for count in figures["trioserve direct"].values())


def test_wakeup_tool_runs_and_reports_every_transport(tmp_path):
    out = tmp_path / "figures.json"
    stdout = run_tool("wakeups", out, "--count", "5", "--gaps", "0,1", timeout=120)
    rows = ("TCP loopback", "ZeroMQ DEALER-ROUTER", "ZeroMQ, the caller parked in trio")
    assert all(f"| {row} |" in stdout for row in rows)
    figures = json.loads(out.read_text())["results"]
    assert set(figures) == set(rows)
    assert all(set(cells) == {"0", "1"} for cells in figures.values())


def test_a_capacity_only_bench_run_writes_its_own_section_not_the_main_table(tmp_path):
    main_begin, main_end = "<!-- bench:begin -->", "<!-- bench:end -->"
    capacity_begin, capacity_end = "<!-- bench-capacity:begin -->", "<!-- bench-capacity:end -->"
    doc = tmp_path / "benchmarks.md"
    main_table = f"{main_begin}\nthe main table\n{main_end}"
    doc.write_text(
        f"# B\n\n{main_table}\n\n### Capacity\n\n{capacity_begin}\nold\n{capacity_end}\n"
    )
    # What tools.bench does with --write-docs: the run's table between its plan's markers.
    for scenarios, text in (("capacity", "new capacity"), ("json,capacity", "new main")):
        begin, end = markers(SimpleNamespace(scenarios=scenarios.split(",")))
        write_docs(doc, f"{begin}\n{text}\n{end}", begin, end)
        if text == "new capacity":
            assert main_table in doc.read_text()  # the main table survives a capacity run
    written = doc.read_text()
    assert f"{main_begin}\nnew main\n{main_end}" in written
    assert f"{capacity_begin}\nnew capacity\n{capacity_end}" in written


async def test_the_floor_relay_relays_tokens_and_loadgen_measures_it(nursery):
    from tests.helpers.processes import Proc, free_port, start_engine_process
    from trioserve.engine_programs.mock import expected_text

    port = free_port()
    engine = f"tcp://127.0.0.1:{port}"
    await start_engine_process(nursery, port)
    relay = await Proc.start(
        nursery, "--engine", engine, program=("-m", "tools.floor_relay"), cwd=ROOT
    )
    match = await relay.wait_for_output(r"Running on http://127\.0\.0\.1:(\d+)")
    relay_port = int(match.group(1))
    # The tokens of the engine's answer, in order, then [DONE] and the last chunk; and the
    # connection serves the next request.
    body = json.dumps(
        {"messages": [{"role": "user", "content": "floor"}], "stream": True, "max_tokens": 3}
    ).encode()
    request = b"POST / HTTP/1.1\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    stream = await trio.open_tcp_stream("127.0.0.1", relay_port)
    for _ in range(2):
        await stream.send_all(request)
        data = b""
        with trio.fail_after(HANG_GUARD):
            while not data.endswith(b"0\r\n\r\n"):
                data += await stream.receive_some(65536)
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")
        lines = [line.strip() for line in data.split(b"\r\n")]
        events = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
        text = "".join(e["choices"][0]["delta"]["content"] for e in events)
        assert text == expected_text("floor", 3) and b"data: [DONE]" in data
    await stream.aclose()
    result = await trio.run_process(
        [
            *tool_command("loadgen"),
            "ttft",
            "--engine",
            engine,
            "--url",
            f"http://127.0.0.1:{relay_port}",
            "--count",
            "3",
            "--warmup-count",
            "1",
            "--ttft-ms",
            "5",
            "--ttft-tokens",
            "2",
        ],
        capture_stdout=True,
        cwd=ROOT,
    )
    figures = json.loads(result.stdout)
    assert figures["count"] == 3 and figures["frontend_p50_ms"] >= 5


def test_the_enginecore_codec_tool_runs_and_reports_both_decoders():
    result = subprocess.run(
        [*tool_command("bench_enginecore_codec"), "--rounds", "1"]
        + ["--per-round", "10", "--outputs", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"msgspec_structs", "msgpack_lists", "outputs_per_step"}
    assert report["msgspec_structs"]["min_us"] > 0 and report["msgpack_lists"]["min_us"] > 0


async def test_the_null_enginecore_answers_the_direct_path_and_takes_its_aborts(tmp_path):
    """tools/null_enginecore.py, the engine of ``bench_vllm --engine null``: found through
    the direct path's handshake (``--vllm-attach``), it answers ``max_tokens`` tokens of its
    fixed text, one a step, and an abort ends a request at once (the running figure the
    bench reads drops to 0)."""
    import httpx

    from tests.helpers.processes import free_port
    from tests.helpers.text_models import build_text_model
    from tools.null_enginecore import TEXT

    model_dir = build_text_model(tmp_path / "model", harder=False)
    handshake = f"127.0.0.1:{free_port()}"
    frontend = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioserve", "run", "--vllm", str(model_dir), "--port", "0"]
        + ["--vllm-attach", handshake, "--vllm-load-timeout", str(HANG_GUARD), "--no-access-log"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    engine = await trio.lowlevel.open_process(
        [*tool_command("null_enginecore"), "--handshake", f"tcp://{handshake}"]
        + ["--model", str(model_dir), "--step-ms", "5"],
        cwd=ROOT,
    )
    try:
        url = await _url_of(frontend)
        async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as http:
            body = {"prompt": "x", "max_tokens": 12, "temperature": 0}
            answer = (await http.post("/v1/completions", json=body)).json()
            assert answer["usage"]["completion_tokens"] == 12
            assert answer["choices"][0]["text"] in TEXT * 2  # its text, cycled
            long = {**body, "max_tokens": 100_000, "stream": True}
            with trio.fail_after(HANG_GUARD):
                async with http.stream("POST", "/v1/completions", json=long) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            assert await _running(http) == 1  # the step's figures
                            break  # streaming: hang up
                while await _running(http) != 0:  # the ABORT reached it
                    await trio.sleep(0.05)
    finally:
        for process in (engine, frontend):
            process.terminate()
        with trio.fail_after(HANG_GUARD):
            for process in (engine, frontend):
                await process.wait()


async def _url_of(process: trio.Process) -> str:
    assert process.stderr is not None
    seen = b""
    with trio.fail_after(HANG_GUARD):
        async for chunk in process.stderr:
            seen += chunk
            if b"Running on " in seen:
                return seen.split(b"Running on ", 1)[1].split(b" ", 1)[0].decode().strip()
    raise AssertionError(f"the frontend did not start: {seen.decode(errors='replace')}")


async def _running(http) -> float:
    metrics = (await http.get("/metrics")).text
    [line] = [m for m in metrics.splitlines() if m.startswith("trioserve_engine_requests_running")]
    return float(line.rsplit(" ", 1)[1])

"""trioserve against the reference frontend (FastAPI + uvicorn): throughput, latency, memory.

Starts the mock engine, trioserve (``trioserve run``, once per ``--trioserve-args``) and
the reference (``tools/reference_server.py``) as separate processes, pins them with
``taskset`` (the frontend under test alone on core 0; the engine, the load generator and
this script on core 1), and drives the frontends in alternation for ``--rounds`` rounds
with ``tools/loadgen.py``, A B in one round and B A in the next. Each round starts the
frontends afresh, and again after the memory figures. Before the first round it checks
that both frontends answer the same bytes to the same requests.

Figures (each: the median over rounds, its range, and trioserve/reference per round):

- non-streaming requests/s at concurrency 1 and 32, latency p50/p99;
- streaming at 32, 256 and 1024 concurrent streams, the engine producing a fixed token
  rate per stream: token events relayed per second, inter-token latency p50/p99, CPU the
  frontend used per relayed event (/proc/PID/stat);
- time to first token added by the frontend to the engine's own (c=1);
- resident memory of the frontend holding 1,000 and 10,000 idle, open streams;
- relay capacity: ``--capacity-streams`` streams offered more and more tokens per second
  (``--capacity-rates``); a frontend keeps up with a level when it relays at least 95%
  of the offered events with an inter-token p99 within twice the token period plus
  50 ms (a frontend that falls behind and then writes tokens in clumps relays them all,
  but not at a steady pace), and its capacity is the most events/s it relayed at a level
  it kept up with. On two cores the load side (the engine and the load generator,
  sharing core 1) tops out near 20,000 events/s, less than trioserve relays on half a
  core, so for this scenario each frontend is capped to ``--capacity-cpu`` of a core by
  a cgroup CPU quota (when the machine allows one; the report says which).

The load side reports its own CPU (load generator, engine, each core, everything else on
the machine), so a run shows whether it measured the frontend or something else. trioserve's
admission bound (``--max-concurrent-requests``) is raised to what the plan opens at once
(the reference has none); the package's code is fingerprinted at every round, so a run
during which someone edited it says so. Process logs stay in a temporary directory named
in the JSON (``meta.logs``).

    python tools/bench.py                          # the full run (about 19 minutes, 11 capacity)
    python tools/bench.py --quick                  # a seconds-long smoke run
    python tools/bench.py --trioserve-args "--server builtin" --trioserve-args "--server hypercorn"
    python tools/bench.py --json figures.json --write-docs docs/benchmarks.md
    git worktree add /tmp/before COMMIT && python tools/bench.py --baseline /tmp/before

Several workers (``trioserve run --workers N``): a frontend's CPU and memory figures are
those of its whole process tree (the supervisor and its workers), the capacity scenario's
CPU cap holds the whole tree and is ``--capacity-cpu`` per worker, and ``--no-pin`` lets
the workers use both cores (pinned, they would share core 0). ``--no-reference`` compares
the trioserve runs with one another instead, the last one as the baseline:

    python tools/bench.py --no-pin --no-reference --scenarios json,capacity \
        --trioserve-args "--workers 2" --trioserve-args "--workers 1"

All traffic is on 127.0.0.1; every step is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from toolkit import load
from toolkit.machine import machine, source_code, source_state
from toolkit.processes import (
    FRONTEND_CORE,
    LOAD_CORE,
    URL_RE,
    CpuQuota,
    Proc,
    free_port,
    pin_prefix,
    raise_fd_limit,
    run_json_tool,
    spawn,
    wait_for_log,
    wait_healthy,
)
from toolkit.progress import Progress
from toolkit.reports import DASH, cell, ratios, write_docs

TOOLS = Path(__file__).resolve().parent

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
#: Tokens/s per stream of the capacity levels: 2,560 events/s apart at 512 streams.
CAPACITY_RATES = (10, 15, 20, 25, 30, 35, 40)
#: A run of the capacity scenario alone (it takes longer than all the others together)
#: has a section of its own, so that running it does not replace the main table.
CAPACITY_BEGIN, CAPACITY_END = "<!-- bench-capacity:begin -->", "<!-- bench-capacity:end -->"


def markers(plan: Plan) -> tuple[str, str]:
    """The docs section a run's table goes to."""
    if list(plan.scenarios) == ["capacity"]:
        return CAPACITY_BEGIN, CAPACITY_END
    return BEGIN, END


#: Tokens per answer in the TTFT scenario: one (the first event is also the last: the
#: finish and [DONE] leave with it), and a short stream (the first token alone, as in
#: any real stream).
TTFT_TOKENS = (1, 4)
#: A frontend keeps up with an offered load when it relays this share of it...
KEEP_UP_SHARE = 0.95
#: ... with an inter-token p99 under this many token periods, plus the slack below (ms).
KEEP_UP_ITL_PERIODS = 2.0
KEEP_UP_ITL_SLACK_MS = 50.0


def keep_up_itl_ms(rate: float) -> float:
    """The inter-token p99 (ms) a frontend must stay within at ``rate`` tokens/s a stream."""
    return KEEP_UP_ITL_PERIODS * 1000 / rate + KEEP_UP_ITL_SLACK_MS


# -- frontends ------------------------------------------------------------------------------


@dataclass
class FrontendSpec:
    label: str
    command: list[str]  # without the engine address and port
    workers: int = 1  # trioserve's --workers: the capacity scenario's CPU cap is per worker


def trioserve_options() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "trioserve", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout


def frontend_specs(
    trioserve_args: list[str],
    most_requests: int,
    baselines: list[str] = (),
    reference: bool = True,
) -> list[FrontendSpec]:
    """trioserve once per ``--trioserve-args``, then once per ``--baseline`` checkout,
    then the reference (unless not wanted).

    trioserve's admission bound (``--max-concurrent-requests``, where it exists) is raised
    to what the plan opens at once, unless the arguments set it: the reference has none.
    """
    specs = []
    admission = "--max-concurrent-requests" in trioserve_options()
    workers_option = argparse.ArgumentParser(add_help=False)
    workers_option.add_argument("--workers", type=int, default=1)
    for extra in trioserve_args or [""]:
        label = "trioserve" + (f" {extra}" if extra else "")
        argv = shlex.split(extra)
        if admission and not any(a.startswith("--max-concurrent-requests") for a in argv):
            argv += ["--max-concurrent-requests", str(most_requests)]
        workers = workers_option.parse_known_args(argv)[0].workers
        specs.append(
            FrontendSpec(label, [sys.executable, "-m", "trioserve", "run", *argv], workers)
        )
    for checkout in baselines:
        # Another version of trioserve, from a checkout's src/ (a git worktree of an earlier
        # commit, say), against the same engine in the same run: before/after figures.
        src = Path(checkout).resolve() / "src"
        commit = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        argv = ["--max-concurrent-requests", str(most_requests)] if admission else []
        command = ["env", f"PYTHONPATH={src}", sys.executable, "-m", "trioserve", "run", *argv]
        specs.append(FrontendSpec(f"trioserve@{commit or checkout}", command))
    if reference:
        specs.append(
            FrontendSpec("reference", [sys.executable, str(TOOLS / "reference_server.py")])
        )
    return specs


def start_frontend(spec: FrontendSpec, engine: str, pin: bool, workdir: Path) -> Proc:
    command = [
        *pin_prefix(FRONTEND_CORE, pin),
        *spec.command,
        "--engine",
        engine,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    proc = spawn(spec.label, command, workdir)
    proc.url = wait_for_log(proc, URL_RE).group(1)
    wait_healthy(proc)
    return proc


# -- the byte-for-byte check ----------------------------------------------------------------

CHECKS = {
    "JSON": {"max_tokens": 5},
    "SSE + include_usage": {
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    "SSE": {"max_tokens": 3, "stream": True},
    "SSE, engine error after 2 tokens": {"max_tokens": 5, "stream": True, "mock_error_after": 2},
    "JSON, engine error 429": {"max_tokens": 5, "mock_error_after": 0, "mock_error_status": 429},
}


def fetch(url: str, body: dict, request_id: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"content-type: application/json\r\nx-request-id: {request_id}\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode()
    parts: list[bytes] = []
    response = load.Response()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + payload)
        while not response.done:
            data = sock.recv(65536)
            if not data:
                break
            response.feed(data, parts.append)
    return response.status, b"".join(parts)


def byte_check(frontends: list[Proc]) -> list[dict]:
    """Same request, same request id, to every frontend: are the bodies identical?"""
    results = []
    for i, (name, extra) in enumerate(CHECKS.items()):
        body = {"messages": [{"role": "user", "content": f"Check {i}: the same bytes?"}]}
        body.update(extra)
        request_id = f"bytecheck-{i}-{uuid.uuid4().hex[:8]}"
        answers = {}
        for proc in frontends:
            status, raw = fetch(proc.url, body, request_id)
            answers[proc.name] = (status, re.sub(rb'"created":\d+', b'"created":0', raw))
        first = next(iter(answers.values()))
        same = all(answer == first for answer in answers.values())
        entry = {"case": name, "identical": same, "bytes": len(first[1])}
        if not same:
            entry["answers"] = {
                k: [v[0], v[1][:2000].decode(errors="replace")] for k, v in answers.items()
            }
        results.append(entry)
    return results


# -- scenarios ------------------------------------------------------------------------------


@dataclass
class Plan:
    rounds: int
    json_levels: list[int]
    json_duration: float
    json_warmup: float
    stream_levels: list[int]
    stream_rate: float
    stream_tokens: int
    stream_duration: float
    stream_warmup: float
    ttft_count: int
    ttft_warmup: int
    ttft_ms: float
    idle_levels: list[int]
    scenarios: list[str]
    capacity_streams: int = 512
    capacity_rates: list[int] = field(default_factory=lambda: list(CAPACITY_RATES))
    capacity_duration: float = 4.0
    capacity_warmup: float = 2.0
    capacity_cpu: float = 0.25

    def steps(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        if "idle" in self.scenarios:
            out.append(("idle", 0))
        if "json" in self.scenarios:
            out += [("json", c) for c in self.json_levels]
        if "stream" in self.scenarios:
            out += [("stream", n) for n in self.stream_levels]
        if "ttft" in self.scenarios:  # the level: tokens per answer
            out += [("ttft", tokens) for tokens in TTFT_TOKENS]
        if "capacity" in self.scenarios:
            out += [("capacity", rate) for rate in self.capacity_rates]
        return out

    def estimate(self, step: tuple[str, int]) -> float:
        kind, level = step
        if kind == "json":
            return self.json_duration + self.json_warmup + 1
        if kind == "stream":
            return self.stream_duration + self.stream_warmup + 1 + level / 300
        if kind == "ttft":
            return 1 + (self.ttft_count + self.ttft_warmup) * (self.ttft_ms + 3 + level) / 1000
        if kind == "capacity":
            return self.capacity_duration + self.capacity_warmup + 1 + self.capacity_streams / 300
        return 2 + sum(self.idle_levels) / 1500


def _stream_args(
    streams: int, rate: float, tokens: int, duration: float, warmup: float
) -> list[str]:
    return [
        "stream",
        "--streams",
        str(streams),
        "--rate",
        str(rate),
        "--stream-tokens",
        str(tokens),
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
    ]


def loadgen_args(plan: Plan, step: tuple[str, int], engine_address: str) -> list[str]:
    kind, level = step
    if kind == "json":
        return [
            "json",
            "--concurrency",
            str(level),
            "--duration",
            str(plan.json_duration),
            "--warmup",
            str(plan.json_warmup),
        ]
    if kind == "capacity":  # streams that never finish, so that the load stays put
        return _stream_args(
            plan.capacity_streams,
            level,
            1_000_000,
            plan.capacity_duration,
            plan.capacity_warmup,
        )
    if kind == "stream":
        return _stream_args(
            level, plan.stream_rate, plan.stream_tokens, plan.stream_duration, plan.stream_warmup
        )
    if kind == "ttft":
        return [
            "ttft",
            "--engine",
            engine_address,
            "--count",
            str(plan.ttft_count),
            "--warmup-count",
            str(plan.ttft_warmup),
            "--ttft-ms",
            str(plan.ttft_ms),
            "--ttft-tokens",
            str(level),
        ]
    return ["idle", "--engine", engine_address, "--levels", ",".join(map(str, plan.idle_levels))]


def run_loadgen(
    args: list[str],
    frontend: Proc,
    engine: Proc,
    pin: bool,
    progress: Progress,
    status: str,
    timeout: float,
) -> dict:
    command = [
        *pin_prefix(LOAD_CORE, pin),
        sys.executable,
        str(TOOLS / "loadgen.py"),
        *args,
        "--url",
        frontend.url,
        "--frontend-pid",
        str(frontend.pid),
        "--engine-pid",
        str(engine.pid),
    ]
    return run_json_tool(command, progress, status, timeout, "loadgen")


def summary_of(kind: str, level: int, result: dict) -> str:
    if "error" in result:
        return f"FAILED: {result['error']}"
    cpu = (
        f"frontend {result.get('frontend_cpu_pct', math.nan):.0f}% CPU "
        f"(core 0 busy {result.get('cpu0_busy_pct', math.nan):.0f}%, core 1 "
        f"{result.get('cpu1_busy_pct', math.nan):.0f}%)"
    )
    if kind == "json":
        return (
            f"{result['rps']:.0f} req/s, p50 {result['p50_ms']:.2f} ms, "
            f"p99 {result['p99_ms']:.2f} ms, {cpu}"
        )
    if kind in ("stream", "capacity"):
        return (
            f"{result['events_per_s']:.0f} events/s (nominal {result['expected_per_s']:.0f}), "
            f"ITL p50 {result['itl_p50_ms']:.0f} ms p99 {result['itl_p99_ms']:.0f} ms, "
            f"{result['frontend_cpu_us_per_event']:.0f} µs CPU/event, {cpu}"
        )
    if kind == "ttft":
        return (
            f"TTFT {result['frontend_p50_ms']:.2f} ms vs engine {result['direct_p50_ms']:.2f} ms: "
            f"+{result['added_p50_ms']:.2f} ms (p99 +{result['added_p99_ms']:.2f} ms)"
        )
    levels = ", ".join(
        f"{lvl}: {v['rss_bytes'] / 2**20:.0f} MiB" for lvl, v in result["levels"].items()
    )
    return f"RSS idle {result['rss_baseline_bytes'] / 2**20:.0f} MiB, {levels}"


# -- figures --------------------------------------------------------------------------------


@dataclass
class Figure:
    key: str
    label: str
    unit: str
    digits: int
    values: dict[str, list[float]] = field(default_factory=dict)  # frontend -> per round


def extract(
    plan: Plan, rounds: list[dict[str, dict[str, dict]]], labels: list[str]
) -> list[Figure]:
    """The table's rows: one figure per metric, its value per frontend per round."""
    defs: list[tuple[str, str, str, int, str, str]] = []  # key, label, unit, digits, step, field
    for c in plan.json_levels if "json" in plan.scenarios else []:
        step = f"json:{c}"
        defs += [
            (f"json_c{c}_rps", f"non-streaming, c={c}: requests/s", "req/s", 0, step, "rps"),
            (f"json_c{c}_p50", f"non-streaming, c={c}: latency p50", "ms", 2, step, "p50_ms"),
            (f"json_c{c}_p99", f"non-streaming, c={c}: latency p99", "ms", 2, step, "p99_ms"),
            (
                f"json_c{c}_cpu_req",
                f"non-streaming, c={c}: frontend CPU per request",
                "µs",
                0,
                step,
                "frontend_cpu_us_per_request",
            ),
        ]
    for n in plan.stream_levels if "stream" in plan.scenarios else []:
        step = f"stream:{n}"
        defs += [
            (f"stream_{n}_eps", f"{n} streams: events/s relayed", "ev/s", 0, step, "events_per_s"),
            (f"stream_{n}_itl50", f"{n} streams: inter-token p50", "ms", 1, step, "itl_p50_ms"),
            (f"stream_{n}_itl99", f"{n} streams: inter-token p99", "ms", 1, step, "itl_p99_ms"),
            (
                f"stream_{n}_cpu_ev",
                f"{n} streams: frontend CPU per event",
                "µs",
                1,
                step,
                "frontend_cpu_us_per_event",
            ),
            (f"stream_{n}_cpu", f"{n} streams: frontend CPU", "%", 0, step, "frontend_cpu_pct"),
        ]
    if "ttft" in plan.scenarios:
        defs += [
            (
                "ttft_p50",
                "TTFT through the frontend, p50 (c=1)",
                "ms",
                2,
                "ttft:1",
                "frontend_p50_ms",
            ),
            (
                "ttft_engine_p50",
                "TTFT straight from the engine, p50",
                "ms",
                2,
                "ttft:1",
                "direct_p50_ms",
            ),
            (
                "ttft_added_p50",
                "TTFT added by the frontend, p50",
                "ms",
                2,
                "ttft:1",
                "added_p50_ms",
            ),
            (
                "ttft_added_p99",
                "TTFT added by the frontend, p99",
                "ms",
                2,
                "ttft:1",
                "added_p99_ms",
            ),
            *(
                (
                    f"ttft_added_{which}_{tokens}",
                    f"TTFT added by the frontend, {which}, {tokens}-token answers",
                    "ms",
                    2,
                    f"ttft:{tokens}",
                    f"added_{which}_ms",
                )
                for tokens in TTFT_TOKENS[1:]
                for which in ("p50", "p99")
            ),
        ]
    if "idle" in plan.scenarios:
        defs.append(("rss_idle", "RSS, no streams open", "MiB", 1, "idle:0", "rss_baseline_bytes"))
        for level in plan.idle_levels:
            defs.append(
                (
                    f"rss_{level}",
                    f"RSS, {level:,} idle streams open",
                    "MiB",
                    1,
                    "idle:0",
                    f"rss:{level}",
                )
            )
        top = plan.idle_levels[-1]
        defs.append(
            (
                "rss_per_stream",
                f"RSS per idle stream (at {top:,})",
                "KiB",
                1,
                "idle:0",
                f"per:{top}",
            )
        )
        defs.append(
            (
                "idle_aborted_s",
                f"{top:,} idle clients reset: until the engine has every abort",
                "s",
                2,
                "idle:0",
                "aborted_in_s",
            )
        )
    for rate in plan.capacity_rates if "capacity" in plan.scenarios else []:
        offered = rate * plan.capacity_streams
        defs += [
            (
                f"capacity_{rate}",
                f"capacity, {offered:,} events/s offered: relayed",
                "ev/s",
                0,
                f"capacity:{rate}",
                "events_per_s",
            ),
            (
                f"capacity_{rate}_itl99",
                f"capacity, {offered:,} events/s offered: inter-token p99 "
                f"(keeping up: ≤ {keep_up_itl_ms(rate):.0f})",
                "ms",
                0,
                f"capacity:{rate}",
                "itl_p99_ms",
            ),
        ]
    defs += [
        (
            "load_other",
            "other processes' CPU, mean over windows",
            "% of a core",
            0,
            "*",
            "mean:other_cpu_pct",
        ),
        (
            "load_loadgen",
            "load generator CPU, worst window",
            "% of a core",
            0,
            "*",
            "max:loadgen_cpu_pct",
        ),
        ("load_engine", "engine CPU, worst window", "% of a core", 0, "*", "max:engine_cpu_pct"),
    ]
    figures = []
    for key, label, unit, digits, step, name in defs:
        figure = Figure(key, label, unit, digits)
        for frontend in labels:
            series = []
            for rnd in rounds:
                if step == "*":
                    series.append(_across(rnd.get(frontend, {}), name))
                    continue
                result = rnd.get(frontend, {}).get(step)
                value = _field(result, name)
                if value is not None and unit == "MiB":
                    value /= 2**20
                if value is not None and unit == "KiB":
                    value /= 1024
                series.append(value if value is not None else math.nan)
            figure.values[frontend] = series
        figures.append(figure)
    if "capacity" in plan.scenarios:
        figure = Figure(
            "capacity",
            f"relay capacity: most events/s relayed while keeping up (≥{KEEP_UP_SHARE:.0%} "
            f"of the offered, inter-token p99 ≤ {KEEP_UP_ITL_PERIODS:g} token periods "
            f"+ {KEEP_UP_ITL_SLACK_MS:g} ms)",
            "ev/s",
            0,
        )
        for frontend in labels:
            figure.values[frontend] = [capacity_of(plan, rnd.get(frontend, {})) for rnd in rounds]
        at = next(i for i, f in enumerate(figures) if f.key.startswith("capacity_"))
        figures.insert(at, figure)
    return figures


def capacity_of(plan: Plan, results: dict[str, dict]) -> float:
    """The most events/s a frontend relayed at a load level it kept up with (nan: none)."""
    best = math.nan
    for rate in plan.capacity_rates:
        result = results.get(f"capacity:{rate}") or {}
        relayed = result.get("events_per_s")
        if relayed is None or "error" in result:
            continue
        if relayed >= KEEP_UP_SHARE * result["expected_per_s"] and result[
            "itl_p99_ms"
        ] <= keep_up_itl_ms(rate):
            best = relayed if math.isnan(best) else max(best, relayed)
    return best


def _across(results: dict[str, dict], name: str) -> float:
    """``mean:KEY`` or ``max:KEY`` over every measuring window of one frontend's round."""
    how, key = name.split(":")
    values = [r[key] for r in results.values() if isinstance(r, dict) and key in r]
    if not values:
        return math.nan
    return statistics.fmean(values) if how == "mean" else max(values)


def _field(result: dict | None, name: str) -> float | None:
    if not result or "error" in result:
        return None
    if name.startswith("rss:"):
        return result["levels"][name[4:]]["rss_bytes"]
    if name.startswith("per:"):
        return result["levels"][name[4:]]["per_stream_bytes"]
    value = result.get(name)
    return float(value) if value is not None else None


def load_side(rounds: list[dict[str, dict[str, dict]]]) -> dict[str, float]:
    worst: dict[str, float] = {}
    for rnd in rounds:
        for per_step in rnd.values():
            for result in per_step.values():
                if not isinstance(result, dict):
                    continue
                for key in (
                    "loadgen_cpu_pct",
                    "engine_cpu_pct",
                    "cpu0_busy_pct",
                    "cpu1_busy_pct",
                    "other_cpu_pct",
                    "cpu0_steal_pct",
                    "cpu1_steal_pct",
                ):
                    if key in result:
                        worst[key] = max(worst.get(key, 0.0), result[key])
    return worst


def report(
    plan: Plan,
    meta: dict,
    figures: list[Figure],
    labels: list[str],
    checks: list[dict],
    worst: dict[str, float],
    failures: list[str],
) -> str:
    m = meta["machine"]
    reference = labels[-1]
    begin, end = markers(plan)
    heading = (
        ["## trioserve against a FastAPI + uvicorn frontend", ""]
        if begin != CAPACITY_BEGIN and reference == "reference"
        else []
    )
    lines = [
        begin,
        *heading,
        f"Measured {meta['date']} on {m['machine']}, {m['cpu']}, {m['cores']} cores, "
        f"{m['memory']}, Linux {m['kernel']}, Python {m['python']}, with "
        f"`{meta['command']}` ({meta['duration_s'] / 60:.1f} minutes).",
        "",
        f"- Frontends: {', '.join(f'`{x}`' for x in meta['frontend_commands'])}. "
        + (
            "The reference is `tools/reference_server.py`: FastAPI on uvicorn (uvloop, "
            "httptools, no access log), orjson + pydantic for the body, pre-encoded chunks, "
            "an asyncio DEALER client with one reader task, heartbeats and an abort on "
            "disconnect."
            if reference == "reference"
            else f"No reference frontend: the baseline is `{reference}`."
        ),
        f"- Pinning: {meta['pinning']}.",
        f"- Engine: `{meta['engine_command']}`. Streams ask for {plan.stream_rate:g} tokens/s "
        f"each, {plan.stream_tokens} tokens per answer, next answer on the same connection; "
        "non-streaming requests ask for 16 tokens with no engine delay (mock_ttft_ms 0, "
        "mock_tokens_per_second 0).",
        f"- {plan.rounds} round(s), A B then B A; each cell is the median over rounds "
        f"(min{DASH}max); "
        f"the last column is {labels[0]} / {reference} for each round. Windows: "
        f"{plan.json_duration:g} s (non-streaming), {plan.stream_duration:g} s (streaming), after "
        f"{plan.json_warmup:g} s / {plan.stream_warmup:g} s of warm-up. Inter-token latency "
        "is the gap between a stream's consecutive tokens as the client reads them (tokens "
        "read together: 0). TTFT: the same request alternately straight to the engine over "
        "ZeroMQ and through a frontend, one at a time, the frontends taking turns request "
        f"by request in one run per round, {plan.ttft_count} each, mock TTFT "
        f"{plan.ttft_ms:g} ms; answers of one token (the first event is also the last), "
        f"and of {', '.join(map(str, TTFT_TOKENS[1:]))} (the first token alone in its engine "
        "step, the rest 1 ms apart; each measured request starts with the engine idle).",
        *(
            [
                f"- Capacity: {plan.capacity_streams} streams at each of "
                f"{', '.join(map(str, plan.capacity_rates))} tokens/s, "
                f"{plan.capacity_duration:g} s windows; {meta['capacity_cpu']}."
            ]
            if "capacity" in plan.scenarios
            else []
        ),
        f"- Code under test: {', '.join(dict.fromkeys(meta['source_per_round']))}"
        + (
            " (**it changed during the run**: rounds are not comparable)"
            if len({source_code(state) for state in meta["source_per_round"]}) > 1
            else ""
        )
        + ".",
        "- Same bytes: "
        + ", ".join(
            f"{c['case']} {'identical' if c['identical'] else '**DIFFERENT**'}" for c in checks
        )
        + " (bodies compared with `created` masked).",
        "",
    ]
    head = (
        "| figure | "
        + " | ".join(labels)
        + " | "
        + " | ".join(f"{label} / {reference}" for label in labels[:-1])
        + " |"
    )
    lines += [head, "|---" * (2 * len(labels)) + "|"]
    for figure in figures:
        row = f"| {figure.label} ({figure.unit}) | " + " | ".join(
            cell(figure.values[label], figure.digits) for label in labels
        )
        row += " | " + " | ".join(
            ratios(figure.values[label], figure.values[reference]) for label in labels[:-1]
        )
        lines.append(row + " |")
    lines += [
        "",
        "Load side, worst window of the run: load generator "
        f"{worst.get('loadgen_cpu_pct', math.nan):.0f}% of a core, engine "
        f"{worst.get('engine_cpu_pct', math.nan):.0f}%, core 0 busy "
        f"{worst.get('cpu0_busy_pct', math.nan):.0f}%, core 1 busy "
        f"{worst.get('cpu1_busy_pct', math.nan):.0f}%, other processes "
        f"{worst.get('other_cpu_pct', math.nan):.0f}% of a core, steal "
        f"{max(worst.get('cpu0_steal_pct', 0), worst.get('cpu1_steal_pct', 0)):.0f}%.",
    ]
    if failures:
        lines += ["", "Runs that failed:", ""] + [f"- {f}" for f in failures]
    lines.append(end)
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------


def levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def build_plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        plan = Plan(
            rounds=1,
            json_levels=[1, 32],
            json_duration=1.0,
            json_warmup=0.3,
            stream_levels=[8, 32, 64],
            stream_rate=args.stream_rate,
            stream_tokens=args.stream_tokens,
            stream_duration=1.5,
            stream_warmup=0.5,
            ttft_count=20,
            ttft_warmup=5,
            ttft_ms=args.ttft_ms,
            idle_levels=[50, 200],
            scenarios=args.scenarios,
            capacity_streams=32,
            capacity_rates=[10, 40],
            capacity_duration=1.5,
            capacity_cpu=args.capacity_cpu,
        )
    else:
        plan = Plan(
            rounds=args.rounds,
            json_levels=args.json_levels,
            json_duration=args.json_duration,
            json_warmup=1.0,
            stream_levels=args.stream_levels,
            stream_rate=args.stream_rate,
            stream_tokens=args.stream_tokens,
            stream_duration=args.stream_duration,
            stream_warmup=2.0,
            ttft_count=args.ttft_count,
            ttft_warmup=20,
            ttft_ms=args.ttft_ms,
            idle_levels=args.idle_levels,
            scenarios=args.scenarios,
            capacity_streams=args.capacity_streams,
            capacity_rates=args.capacity_rates,
            capacity_cpu=args.capacity_cpu,
        )
    return plan


def main() -> int:
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run, 1 round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (A B, then B A)")
    parser.add_argument(
        "--trioserve-args",
        action="append",
        default=[],
        metavar="ARGS",
        help="extra arguments of `trioserve run` (repeatable: one trioserve per use)",
    )
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="CHECKOUT",
        help="also run the trioserve of this source checkout (a git worktree of an earlier "
        "commit), for before/after figures in one run (repeatable)",
    )
    parser.add_argument("--json-levels", type=levels, default=[1, 32], help="concurrencies")
    parser.add_argument("--json-duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument(
        "--stream-levels", type=levels, default=[32, 256, 1024], help="concurrent streams"
    )
    parser.add_argument("--stream-rate", type=float, default=5.0, help="tokens/s per stream")
    parser.add_argument("--stream-tokens", type=int, default=64, help="tokens per answer")
    parser.add_argument("--stream-duration", type=float, default=6.0, help="seconds per run")
    parser.add_argument("--ttft-count", type=int, default=200, help="requests per side")
    parser.add_argument("--ttft-ms", type=float, default=10.0, help="the mock engine's TTFT")
    parser.add_argument(
        "--idle-levels", type=levels, default=[1000, 10000], help="idle streams held open"
    )
    parser.add_argument(
        "--capacity-streams", type=int, default=512, help="capacity: concurrent streams"
    )
    parser.add_argument(
        "--capacity-rates",
        type=levels,
        default=list(CAPACITY_RATES),
        help="capacity: tokens/s per stream, one load level each",
    )
    parser.add_argument(
        "--capacity-cpu",
        type=float,
        default=0.25,
        help="capacity: the frontend's CPU cap, in cores (cgroup quota, where possible)",
    )
    parser.add_argument(
        "--scenarios",
        type=lambda t: t.split(","),
        default=["idle", "json", "stream", "ttft", "capacity"],
        help="which to run",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="no FastAPI reference: the trioserve runs against one another, the last one "
        "(of --trioserve-args, then --baseline) the baseline of the ratio column",
    )
    parser.add_argument("--json", type=Path, help="write every figure here as JSON")
    parser.add_argument(
        "--write-docs",
        type=Path,
        metavar="MARKDOWN",
        help=f"replace the text between {BEGIN} and {END} (a capacity-only run: "
        f"{CAPACITY_BEGIN} and {CAPACITY_END}) in this file (appended if absent)",
    )
    parser.add_argument(
        "--vllm",
        action="store_true",
        help="trioserve in front of vLLM against vLLM's own API server instead: runs "
        "tools/bench_vllm.py with the other arguments (see its --help)",
    )
    if parser.parse_known_args()[0].vllm:
        import bench_vllm

        return bench_vllm.main([arg for arg in sys.argv[1:] if arg != "--vllm"])
    args = parser.parse_args()
    plan = build_plan(args)
    command = "python tools/bench.py" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    if pin:
        os.sched_setaffinity(0, {LOAD_CORE})
        pinning = (
            "taskset: the frontend under test alone on core 0 (the others idle meanwhile); "
            "the mock engine, the load generator and the driver on core 1"
        )
    else:
        pinning = (
            "none (" + ("--no-pin" if args.no_pin else "fewer than 2 cores or no taskset") + ")"
        )
    raise_fd_limit()
    most = max(plan.idle_levels + plan.stream_levels + plan.json_levels)
    most = max(most, plan.capacity_streams) + 64
    specs = frontend_specs(
        args.trioserve_args, most, args.baseline, reference=not args.no_reference
    )
    labels = [spec.label for spec in specs]
    workers_of = {spec.label: spec.workers for spec in specs}
    steps = plan.steps()
    total = plan.rounds * (len(specs) * (sum(plan.estimate(step) for step in steps) + 2) + 3) + 5
    progress = Progress(total)
    progress.note(f"{command}: pinning {pinning}")
    workdir = Path(tempfile.mkdtemp(prefix="trioserve-bench-"))
    quota = CpuQuota.create(plan.capacity_cpu) if "capacity" in plan.scenarios else None
    if "capacity" in plan.scenarios:
        capacity_cpu = (
            f"each frontend capped to {plan.capacity_cpu:g} of a core meanwhile"
            + (" per worker, its whole process tree" if max(workers_of.values()) > 1 else "")
            + " (a cgroup CPU quota, 10 ms period)"
            if quota is not None
            else "no CPU cap (no writable cgroup here): the load side may be the limit"
        )
        progress.note(f"capacity: {capacity_cpu}")
    else:
        capacity_cpu = ""
    t_start = time.monotonic()
    engine_port = free_port()
    engine_address = f"tcp://127.0.0.1:{engine_port}"
    engine_command = [
        sys.executable,
        "-m",
        "trioserve",
        "engine",
        "mock",
        "--bind",
        engine_address,
        "--tokens-per-second",
        f"{plan.stream_rate:g}",
        "--ttft-ms",
        f"{plan.ttft_ms:g}",
        "--allow-fault-injection",  # the scenarios drive the mock's mock_* knobs
    ]
    engine = spawn("engine", [*pin_prefix(LOAD_CORE, pin), *engine_command], workdir)
    rounds: list[dict[str, dict[str, dict]]] = []
    failures: list[str] = []
    checks: list[dict] = []
    sources: list[str] = []
    running: list[Proc] = []
    try:
        wait_for_log(engine, re.compile("mock engine serving"))
        for r in range(plan.rounds):
            sources.append(source_state())
            if r and source_code(sources[-1]) != source_code(sources[-2]):
                progress.note(f"the code under test changed: {sources[-2]} -> {sources[-1]}")
            results: dict[str, dict[str, dict]] = {label: {} for label in labels}
            frontends: list[Proc] = []
            for i, step in enumerate(steps):
                kind, level = step
                # Fresh processes for the memory figures, and fresh ones again after them:
                # 10,000 streams leave a frontend with a big heap and much to collect,
                # which the throughput figures must not inherit.
                if i == 0 or kind == "idle" or steps[i - 1][0] == "idle":
                    for proc in frontends:
                        proc.stop()
                        running.remove(proc)
                    progress.show(f"round {r + 1}/{plan.rounds}: starting the frontends")
                    frontends = []
                    for spec in specs:
                        proc = start_frontend(spec, engine_address, pin, workdir)
                        running.append(proc)
                        frontends.append(proc)
                    if not checks:
                        checks = byte_check(frontends)
                        for check in checks:
                            if not check["identical"]:
                                progress.note(
                                    f"bytes differ: {check['case']}: {check.get('answers')}"
                                )
                # Odd rounds go B A: whatever the first or second run of a pair inherits
                # (a warmer engine, the host's rhythm) falls on each frontend alike.
                order = frontends if r % 2 == 0 else frontends[::-1]
                # TTFT is one run with the frontends taking turns request by request (its
                # differences are a fraction of a millisecond, less than the machine's
                # drift from one run to the next); the first one's run holds the others'.
                measured: dict[str, dict] = {}
                for proc in order:
                    if proc.name in measured:
                        result = measured[proc.name]
                    elif proc.popen.poll() is not None:
                        result = {"error": f"the frontend had exited: {proc.log_tail(500)}"}
                    else:
                        status = f"round {r + 1}/{plan.rounds}: {kind} {level or ''} · {proc.name}"
                        timeout = 120 + 3 * plan.estimate(step)
                        capped = kind == "capacity" and quota is not None
                        if capped:
                            quota.set_share(plan.capacity_cpu * workers_of[proc.name])
                            quota.enter(proc.pid)
                        lg_command = loadgen_args(plan, step, engine_address)
                        others = []
                        if kind == "ttft":
                            others = [p for p in order if p is not proc and p.popen.poll() is None]
                            for other in others:
                                lg_command += ["--also-url", other.url]
                            timeout *= 1 + len(others)
                        try:
                            result = run_loadgen(
                                lg_command, proc, engine, pin, progress, status, timeout
                            )
                        finally:
                            if capped:
                                quota.leave(proc.pid)
                        for other in others:
                            measured[other.name] = result.get("others", {}).get(
                                other.url, {"error": result.get("error", "no figures")}
                            )
                        result.pop("others", None)
                    results[proc.name][f"{kind}:{level}"] = result
                    label = {
                        "json": f"non-streaming c={level}",
                        "stream": f"{level} streams",
                        "capacity": f"capacity {level}/s x {plan.capacity_streams}",
                        "ttft": f"ttft, {level}-token answers",
                    }.get(kind, kind)
                    progress.note(
                        f"round {r + 1} {proc.name:<12} {label}: {summary_of(kind, level, result)}"
                    )
                    if "error" in result:
                        failures.append(f"round {r + 1}, {proc.name}, {label}: {result['error']}")
            rounds.append(results)
            for proc in frontends:
                proc.stop()
                running.remove(proc)
            frontends = []
    finally:
        for proc in running:
            proc.stop()
        engine.stop(graceful=True)
        if quota is not None:
            quota.remove()
    duration = time.monotonic() - t_start
    if sys.stderr.isatty():
        print(file=sys.stderr)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": command,
        "machine": machine(),
        "pinning": pinning,
        "engine_command": shlex.join(["trioserve", *engine_command[3:]]),
        "frontend_commands": [
            shlex.join(
                ["trioserve", *spec.command[3:]]
                if spec.label != "reference"
                else ["python", "tools/reference_server.py"]
            )
            + " --engine … --port 0"
            for spec in specs
        ],
        "duration_s": duration,
        "capacity_cpu": capacity_cpu,
        "logs": str(workdir),
        "source_per_round": sources,
    }
    figures = extract(plan, rounds, labels)
    worst = load_side(rounds)
    text = report(plan, meta, figures, labels, checks, worst, failures)
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "meta": meta,
                    "plan": plan.__dict__,
                    "byte_check": checks,
                    "figures": {
                        f.key: {"label": f.label, "unit": f.unit, "values": f.values}
                        for f in figures
                    },
                    "load_side_worst": worst,
                    "failures": failures,
                    "rounds": rounds,
                },
                indent=2,
                default=str,
            )
        )
    if args.write_docs:
        write_docs(args.write_docs, text, *markers(plan))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

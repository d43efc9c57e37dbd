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

    python -m tools.bench                          # the full run (about 19 minutes, 11 capacity)
    python -m tools.bench --quick                  # a seconds-long smoke run
    python -m tools.bench --trioserve-args "--server builtin" --trioserve-args "--server hypercorn"
    python -m tools.bench --json figures.json --write-docs docs/benchmarks.md
    git worktree add /tmp/before COMMIT && python -m tools.bench --baseline /tmp/before

Several workers (``trioserve run --workers N``): a frontend's CPU and memory figures are
those of its whole process tree (the supervisor and its workers), the capacity scenario's
CPU cap holds the whole tree and is ``--capacity-cpu`` per worker, and ``--no-pin`` lets
the workers use both cores (pinned, they would share core 0). ``--no-reference`` compares
the trioserve runs with one another instead, the last one as the baseline:

    python -m tools.bench --no-pin --no-reference --scenarios json,capacity \
        --trioserve-args "--workers 2" --trioserve-args "--workers 1"

All traffic is on 127.0.0.1; every step is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tools.bench_frontends import byte_check, frontend_specs, start_frontend
from tools.bench_plan import (
    BEGIN,
    CAPACITY_BEGIN,
    CAPACITY_END,
    CAPACITY_RATES,
    END,
    Plan,
    loadgen_args,
    markers,
    run_loadgen,
    summary_of,
)
from tools.bench_report import extract, load_side, report
from tools.toolkit.machine import machine, source_code, source_state
from tools.toolkit.processes import (
    LOAD_CORE,
    CpuQuota,
    Proc,
    free_port,
    pin_prefix,
    raise_fd_limit,
    spawn,
    wait_for_log,
)
from tools.toolkit.progress import Progress
from tools.toolkit.reports import write_docs

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

    parser = argparse.ArgumentParser(
        prog="python -m tools.bench", description=__doc__, formatter_class=Formatter
    )
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
        "tools.bench_vllm with the other arguments (see its --help)",
    )
    if parser.parse_known_args()[0].vllm:
        from tools import bench_vllm

        return bench_vllm.main([arg for arg in sys.argv[1:] if arg != "--vllm"])
    args = parser.parse_args()
    plan = build_plan(args)
    command = "python -m tools.bench" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
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
                else ["python", "-m", "tools.reference_server"]
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

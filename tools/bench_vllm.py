"""trioserve's two vLLM paths against vLLM's own API server, on the same engine options:
CPU per token outside the model, TTFT, throughput, abort latency, and what a long prompt
does to running streams.

Three sides, started once and driven one after the other for ``--rounds`` rounds (the
order rotates each round):

- direct: ``trioserve run --vllm MODEL --vllm-args ARGS`` (the frontend is EngineCore's
  client; vLLM's launcher, EngineCore and its Worker below it);
- shared: ``trioserve engine vllm MODEL --bind ADDRESS ARGS`` (the engine adapter, a process
  of its own over vLLM's EngineCore) and ``trioserve run --engine ADDRESS`` (the frontend);
- vLLM: ``python -m vllm.entrypoints.openai.api_server --model MODEL ARGS`` (FastAPI,
  uvicorn and ``AsyncLLM`` in one process, EngineCore and its Worker below it).

Pinning (``taskset`` and 2+ cores): once a side is up, every thread of its processes that
are not the model (direct: the frontend; shared: the frontend and the adapter; vLLM: the
API server) goes to core 0, and every thread of their descendants (vLLM's launcher,
EngineCore, Worker, resource tracker) to core 1, where vLLM's OpenMP threads are bound too
(``VLLM_CPU_OMP_THREADS_BIND=1``). The load generator and this script run on core 0 (their
CPU is reported): on the model's core, vLLM's Worker starved them for seconds at a time.

Every load window reads each process of the side alone (utime + stime of /proc/PID/stat,
its exited threads included, never its children: a process tree would count the model),
each thread's CPU (schedstat) and the cores it ran on (sampled every 0.25 s) and may run
on; the JSON has them all. A window in which a thread ran or could run off its process's
core, or a process came or went, says so, and its figures are left out of the table.

Figures (each the median over rounds with its range, and side / vLLM per round):

- CPU per generated token outside the model: the counted processes' CPU over a window,
  divided by the tokens generated meanwhile: a non-streaming answer's ``max_tokens`` (exact,
  with ``ignore_eos``); streamed, the engine's own count over the window, step by step
  (``vllm:generation_tokens_total``; the direct path's
  ``trioserve_engine_generation_tokens_total``), since a server that falls behind puts
  several tokens in one event (the client's events are in the JSON beside it);
- non-streaming requests/s at c=32 and c=256, streaming tokens/s at c=32 and c=256
  (``tools.loadgen``'s runs, every request greedy with ``ignore_eos``);
- TTFT at c=1, each side alone; abort latency (the client closes, the engine's running
  count as the side's metrics say it drops to 0);
- a long prompt (``--long-prompt-tokens``) arriving while ``--long-prompt-streams`` streams
  run: their inter-token p99 with long prompts arriving back to back, against the windows
  before and after. The model's length limit refuses it once tokenized (a 400): what is
  measured is the frontend's work on it (parsing, template, tokenizer), not a prefill.

Goals, as ratios to vLLM's API server: CPU per token ≤ 0.3, TTFT p50 ≤ 0.9, non-streaming
requests/s at c=32 ≥ 1.5, streaming tokens/s at c=256 ≥ 1.2. A goal is "met" only when
every round of two or more meets it, "not met" when none does, else "undecided".

    python -m tools.bench_vllm --vllm-python /work/main/.venv-vllm/bin/python --rounds 3
    python -m tools.bench_vllm --quick --json figures.json    # a few minutes, one round
    python -m tools.bench_vllm --engine null ...               # the frontends alone

``--engine null``: each side's engine is ``tools.null_enginecore`` (tokens at no cost,
measured apart as the model is), so that the frontends, not the model, limit the figures;
the direct path attaches to it (``--vllm-attach``), vLLM's API server takes it as its remote
engine (``--data-parallel-size-local 0``); the shared side is not run.
    python -m tools.bench --vllm [the options above]           # the same

All traffic is on 127.0.0.1, bounded in count; every step is bounded in time; every process
this script starts is in a process group of its own, killed at the end (and sent SIGTERM if
the script dies).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools import bench_vllm_load  # (the load child's modes)
from tools import bench_vllm_procs as procs  # (spawning, pinning, per-thread CPU)
from tools import bench_vllm_report as reporting
from tools.bench_vllm_sides import (
    DIRECT,
    MODEL_CORE,
    SERVER_CORE,
    SHARED,
    VLLM,
    Side,
    chat,
    served_name,
    start_sides,
)
from tools.toolkit import machine, processes, reports
from tools.toolkit.progress import Progress

BEGIN, END = "<!-- bench-vllm:begin -->", "<!-- bench-vllm:end -->"
#: The table of ``--engine null`` runs, apart from the model's.
NULL_BEGIN, NULL_END = "<!-- bench-vllm-null:begin -->", "<!-- bench-vllm-null:end -->"
#: The load generator and this script share the non-model processes' core: vLLM's Worker
#: starves whatever else runs on its core, and the model should have its core alone.
LOAD_CORE = SERVER_CORE
ALL_SIDES = {"direct": DIRECT, "shared": SHARED, "vllm": VLLM}
#: vLLM options every side gets unless ``--vllm-args`` says otherwise.
#: The context is longer than the tiny model's 8,192 positions (VLLM_ALLOW_LONG_MAX_MODEL_LEN)
#: so that a 100,000-token prompt is tokenized before it is refused: vLLM (and trioserve
#: after it) refuses a text of more than max_model_len times the longest token's characters
#: unread.
VLLM_ARGS = "--served-model-name tiny --max-model-len 16384 --enforce-eager --dtype float32"
#: Mixed text for the long prompt (accents, CJK, emoji), as tools.bench_tokenize's.
LONG_TEXT = (
    "The quick brown fox jumps over the lazy dog. Grüße aus Köln! Café, naïve, façade. "
    "日本語のテキストも少しあります。中文测试 漢字 한국어 텍스트. Emoji: 🙂 🚀 ✨ 👩‍💻 👍🏽. "
    '{"key": "value", "list": [1, 2, 3]} 1 2 3 4 5 6 7 8 9 10 100 1000\n'
)
DASH = reports.DASH


# -- the plan -------------------------------------------------------------------------------


@dataclass
class Plan:
    rounds: int
    json_levels: list[int]
    stream_levels: list[int]
    json_tokens: int
    stream_tokens: int
    json_duration: float
    json_warmup: float
    stream_duration: float
    stream_warmup: float
    ttft_count: int
    ttft_warmup: int
    ttft_tokens: int
    abort_count: int
    abort_poll_ms: float
    long_prompt_tokens: int
    long_prompt_streams: int
    long_prompt_duration: float

    def load_steps(self) -> list[tuple[str, int]]:
        return [("json", c) for c in self.json_levels] + [("stream", n) for n in self.stream_levels]


def build_plan(args: argparse.Namespace) -> Plan:
    quick = args.quick
    return Plan(
        rounds=1 if quick else args.rounds,
        json_levels=args.json_levels or ([32] if quick else [32, 256]),
        stream_levels=args.stream_levels or ([256] if quick else [32, 256]),
        json_tokens=args.json_tokens,
        stream_tokens=args.stream_tokens,
        json_duration=1.5 if quick else args.duration,
        json_warmup=0.5 if quick else 2.0,
        stream_duration=1.5 if quick else args.duration,
        stream_warmup=1.0 if quick else 3.0,
        ttft_count=10 if quick else args.ttft_count,
        ttft_warmup=3 if quick else 10,
        ttft_tokens=4,
        abort_count=2 if quick else args.abort_count,
        abort_poll_ms=2.0,
        long_prompt_tokens=args.long_prompt_tokens,
        long_prompt_streams=args.long_prompt_streams,
        long_prompt_duration=2.0 if quick else args.long_prompt_duration,
    )


def run_child(spec: dict, pin: bool, progress: Progress, status: str, timeout: float) -> dict:
    command = [
        *processes.pin_prefix(LOAD_CORE, pin),
        *processes.tool_command("bench_vllm"),
        "_loadgen",
        json.dumps(spec),
    ]
    return processes.run_json_tool(command, progress, status, timeout, "the load child")


def measure_round(
    r: int, plan: Plan, sides: list[Side], pin: bool, progress: Progress, args
) -> tuple[dict[str, dict[str, dict]], list[str]]:
    model = served_name(args)
    results: dict[str, dict[str, dict]] = {side.label: {} for side in sides}
    failures: list[str] = []
    # Each side in each place of the order once every len(sides) rounds.
    shift = r % len(sides)
    order = sides[shift:] + sides[:shift]

    def record(side: Side, step: str, result: dict, summary: str) -> None:
        results[side.label][step] = result
        if "error" in result:
            summary = f"FAILED: {result['error']}"
            failures.append(f"round {r + 1}, {side.label}, {step}: {result['error']}")
        elif result.get("threads", {}).get("placement_held") is False:
            summary += " [placement did not hold: left out]"
        progress.note(f"round {r + 1} {side.label:<16} {step}: {summary}")

    def run(side: Side, step: str, spec: dict, timeout: float) -> None:
        if not side.alive():
            record(side, step, {"error": "a process exited"}, "")
            return
        base = {"model": model, "url": side.url, "counted": side.counted, "ramp_timeout": 300}
        status = f"round {r + 1}/{plan.rounds}: {step} · {side.label}"
        result = run_child({**base, **spec}, pin, progress, status, timeout)
        record(side, step, result, reporting.summarize(step.split(":")[0], result))

    for kind, level in plan.load_steps():
        for side in order:
            json_step = kind == "json"
            spec = {
                "mode": kind,
                "level": level,
                "watched": side.watched(pin),
                "tops": side.tops(),
                "token_counter": side.token_counter,
                "tokens": plan.json_tokens if json_step else plan.stream_tokens,
                "duration": plan.json_duration if json_step else plan.stream_duration,
                "warmup": plan.json_warmup if json_step else plan.stream_warmup,
            }
            run(side, f"{kind}:{level}", spec, 420 + 3 * (spec["duration"] + spec["warmup"]))
    # TTFT: one side after the other, each alone: a Worker spins on the shared model core
    # for a while after its request, so another side's request right after waits for it.
    for side in order:
        spec = {
            "mode": "ttft",
            "tokens": plan.ttft_tokens,
            "count": plan.ttft_count,
            "warmup": plan.ttft_warmup,
            "ttft_histogram_url": side.ttft_histogram_url,
        }
        run(side, "ttft", spec, 120 + (plan.ttft_count + plan.ttft_warmup) * 2.0)
    for side in order:
        spec = {
            "mode": "abort",
            "running": side.running,
            "tokens": 3000,
            "count": plan.abort_count,
            "poll_s": plan.abort_poll_ms / 1000,
        }
        run(side, "abort", spec, 120 + plan.abort_count * 4 * 10)
    if plan.long_prompt_tokens:
        for side in order:
            spec = {
                "mode": "long_prompt",
                "level": plan.long_prompt_streams,
                "tokens": plan.stream_tokens,
                "warmup": plan.stream_warmup,
                "duration": plan.long_prompt_duration,
                "unit": LONG_TEXT,
                "copies": args.long_prompt_copies,
            }
            run(side, "long_prompt", spec, 480 + 6 * plan.long_prompt_duration)
    return results, failures


# -- main -----------------------------------------------------------------------------------


def _vllm_version(python: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return (
            subprocess.run(
                [python, "-c", "from importlib.metadata import version as v; print(v('vllm-cpu'))"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.strip()
            or "?"
        )
    return "?"


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def long_prompt_copies(model: str, tokens: int) -> tuple[int, int]:
    """How many copies of :data:`LONG_TEXT` make about ``tokens`` tokens with the model's
    tokenizer, and the tokens they make."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    per_copy = len(tokenizer.encode(LONG_TEXT, add_special_tokens=False).ids)
    copies = max(1, tokens // per_copy)
    return copies, len(tokenizer.encode(LONG_TEXT * copies, add_special_tokens=False).ids)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_vllm", description=__doc__, formatter_class=Formatter
    )
    parser.add_argument("--quick", action="store_true", help="one short round (a few minutes)")
    parser.add_argument(
        "--vllm-python",
        default=os.environ.get("TRIOSERVE_VLLM_PYTHON", sys.executable),
        help="a python with vllm (vllm-cpu) and trioserve installed: runs every side",
    )
    parser.add_argument(
        "--model", help="the model (a path); default: a tiny Llama built by tools.tiny_llama"
    )
    parser.add_argument(
        "--sides",
        type=lambda t: [ALL_SIDES[s] for s in t.split(",")],
        default=None,
        help="which sides, of direct,shared,vllm (vllm is the reference of the ratios); "
        "default: all three (--engine null: direct,vllm)",
    )
    parser.add_argument(
        "--engine",
        choices=("vllm", "null"),
        default="vllm",
        help="each side's engine: vLLM's EngineCore with the model, or a null EngineCore "
        "(tools.null_enginecore: tokens at no cost, so that the frontends are what limits "
        "the figures; the direct and vllm sides only)",
    )
    parser.add_argument(
        "--null-step-ms",
        type=float,
        default=1.0,
        help="--engine null: the least time between two engine steps (a step is one token "
        "for every running request)",
    )
    parser.add_argument("--vllm-args", default=VLLM_ARGS, help="vLLM options, every side")
    parser.add_argument("--kv-cache-gib", type=float, default=1, help="VLLM_CPU_KVCACHE_SPACE")
    parser.add_argument("--start-timeout", type=float, default=420, help="seconds per start")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (the order rotates)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per load window")
    parser.add_argument(
        "--json-levels", type=levels, default=None, help="concurrencies (default 32,256)"
    )
    parser.add_argument(
        "--stream-levels", type=levels, default=None, help="streams (default 32,256)"
    )
    parser.add_argument("--json-tokens", type=int, default=16, help="tokens per JSON answer")
    parser.add_argument("--stream-tokens", type=int, default=64, help="tokens per stream")
    parser.add_argument("--ttft-count", type=int, default=100, help="TTFT requests per side")
    parser.add_argument("--abort-count", type=int, default=15, help="aborts per mode and side")
    parser.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=100_000,
        help="the long prompt's tokens (0: no long-prompt step)",
    )
    parser.add_argument(
        "--long-prompt-streams", type=int, default=256, help="streams running meanwhile"
    )
    parser.add_argument(
        "--long-prompt-duration", type=float, default=6.0, help="seconds per long-prompt window"
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=0,
        help="seconds: start no round that would end past it, measured by the last (0: none)",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument("--json", type=Path, help="write every figure here as JSON")
    parser.add_argument(
        "--write-docs",
        type=Path,
        metavar="MARKDOWN",
        help=f"replace the text between {BEGIN} and {END} in this file (appended if absent)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = build_plan(args)
    if args.sides is None:  # every side the engine allows
        args.sides = [DIRECT, VLLM] if args.engine == "null" else list(ALL_SIDES.values())
    if args.engine == "null" and SHARED in args.sides:
        print("--engine null measures the direct and vllm sides only", file=sys.stderr)
        return 2
    args.sides = [label for label in ALL_SIDES.values() if label in args.sides]
    labels = args.sides
    reference = VLLM if VLLM in labels else labels[-1]
    args.most_requests = (
        max(plan.json_levels + plan.stream_levels + [plan.long_prompt_streams]) + 64
    )
    command = (
        "python -m tools.bench_vllm"
        + (" " + shlex.join(sys.argv[1:] if argv is None else argv)).rstrip()
    )
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    if pin:
        os.sched_setaffinity(0, {LOAD_CORE})
        pinning = (
            f"every thread of the processes outside the model on core {SERVER_CORE}; the "
            f"model's (vLLM's launcher, EngineCore, Worker) on core {MODEL_CORE}, with vLLM's "
            f"OpenMP threads (VLLM_CPU_OMP_THREADS_BIND={MODEL_CORE}); the load generator and "
            f"the driver on core {LOAD_CORE}"
        )
    else:
        pinning = "none"
    processes.raise_fd_limit()
    # SIGTERM ends the run as an error would: every process started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    windows = len(plan.json_levels) * (plan.json_duration + plan.json_warmup + 3) + len(
        plan.stream_levels
    ) * (plan.stream_duration + plan.stream_warmup + 6)
    per_side = (
        windows
        + (plan.ttft_count + plan.ttft_warmup) * 0.2
        + plan.abort_count * 2
        + (3 * plan.long_prompt_duration + 15 if plan.long_prompt_tokens else 0)
    )
    progress = Progress(150 + plan.rounds * len(labels) * per_side)
    progress.note(f"{command}: pinning {pinning}")
    workdir = Path(tempfile.mkdtemp(prefix="trioserve-bench-vllm-"))
    t_start = time.monotonic()
    loadavg_start = _loadavg()
    if args.model is None:
        args.model = str(workdir / "tiny")
        subprocess.run(
            [*processes.tool_command("tiny_llama", args.vllm_python), args.model],
            cwd=processes.ROOT,
            check=True,
            capture_output=True,
            timeout=300,
        )
    args.long_prompt_copies, prompt_tokens = (
        long_prompt_copies(args.model, plan.long_prompt_tokens)
        if plan.long_prompt_tokens
        else (0, 0)
    )
    name = served_name(args)
    sides: list[Side] = []
    rounds: list[dict[str, dict[str, dict]]] = []
    failures: list[str] = []
    sources: list[str] = []
    answers: list[tuple[int, dict]] = []
    rounds_from = 0.0
    # The processes start once and run the code they loaded then: that is the code under
    # test; the working tree per round only says whether someone edited it meanwhile.
    code = machine.source_state()
    try:
        progress.show(f"starting {len(labels)} sides (vLLM takes a minute or more each)")
        try:
            sides = start_sides(args, pin, workdir)
        finally:
            if not sides:  # a start that failed: stop what did start
                for proc_log in workdir.glob("*.log"):
                    progress.note(f"log {proc_log}")
        progress.note(
            "up: "
            + "; ".join(
                f"{s.label}: counted {s.counted}, the model "
                + ", ".join(f"{pid} {what}" for pid, what in s.model.items())
                for s in sides
            )
        )
        answers = [chat(side.url, name, {"max_tokens": 16}) for side in sides]
        for r in range(plan.rounds):
            elapsed = time.monotonic() - t_start
            last = (elapsed - rounds_from) / r if r else 0.0
            if args.time_budget and r and elapsed + last > args.time_budget:
                failures.append(
                    f"stopped after {r} of {plan.rounds} rounds: another would end past "
                    f"--time-budget {args.time_budget:g} s"
                )
                break
            if not r:
                rounds_from = elapsed
            sources.append(machine.source_state())
            results, failed = measure_round(r, plan, sides, pin, progress, args)
            rounds.append(results)
            failures += failed
    except (KeyboardInterrupt, SystemExit) as exc:
        # Interrupted (SIGTERM, Ctrl-C): the rounds done are still reported.
        if not sides:
            raise
        failures.append(f"interrupted ({type(exc).__name__}) after {len(rounds)} round(s)")
    finally:
        for side in sides:
            for proc in side.procs:
                procs.stop_group(proc)
        for proc_log in [] if sides else workdir.glob("*.log"):
            progress.note(f"log {proc_log}")
    for side in sides:
        for proc in side.procs:
            if not procs.group_gone(proc.pid):
                failures.append(f"{side.label}: process group {proc.pid} outlived the run")
    if sys.stderr.isatty():
        print(file=sys.stderr)
    same = (
        all(status == 200 for status, _ in answers)
        and len({reporting.gist(b) for _, b in answers}) == 1
    )
    begin, end = (NULL_BEGIN, NULL_END) if args.engine == "null" else (BEGIN, END)
    meta = {
        "begin": begin,
        "end": end,
        "engine": args.engine,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": code,
        "source_per_round": sources,
        "command": command,
        "machine": machine.machine(),
        "vllm": _vllm_version(args.vllm_python),
        "loadavg_start": loadavg_start,
        "loadavg_end": _loadavg(),
        "pinning": pinning,
        "env": f"VLLM_CPU_KVCACHE_SPACE={args.kv_cache_gib:g}, VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        + (f", VLLM_CPU_OMP_THREADS_BIND={MODEL_CORE}" if pin else ""),
        "commands": {
            s.label: [
                shlex.join(
                    ["trioserve", *p.popen.args[3:]]
                    if list(p.popen.args[1:3]) == ["-m", "trioserve"]
                    else ["python", *p.popen.args[1:]]
                )
                for p in s.procs
            ]
            for s in sides
        },
        "processes": {
            s.label: {
                "counted": {f"{n} {pid}": s.names[pid] for n, pid in s.counted.items()},
                "excluded": {str(pid): what for pid, what in s.model.items()},
            }
            for s in sides
        },
        "long_prompt_tokens": prompt_tokens,
        "same_answer": same,
        "answers": [body for _, body in answers],
        "duration_s": time.monotonic() - t_start,
        "logs": str(workdir),
        "failures": failures,
    }
    meta["placement"] = reporting.placement_of(rounds)
    for label in labels:
        meta["placement"].setdefault(label, [])
    plan.rounds = len(rounds)  # those measured (a budget or a signal may stop it early)
    figures = reporting.figures_of(plan, rounds, labels, reference)
    goals = reporting.goals_of(figures)
    text = reporting.report(plan, meta, figures, goals, labels, reference)
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "meta": meta,
                    "plan": plan.__dict__,
                    "figures": figures,
                    "goals": goals,
                    "rounds": rounds,
                },
                indent=2,
                default=str,
            )
        )
    if args.write_docs:
        reports.write_docs(args.write_docs, text, begin, end)
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_loadgen"]:
        print(json.dumps(bench_vllm_load.run(json.loads(sys.argv[2]))), flush=True)
    else:
        sys.exit(main())

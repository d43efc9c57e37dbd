"""What a ``tools.bench`` run measures: its scenarios and their levels (``Plan``), the
docs section its table goes to, the keep-up rule of the capacity scenario, and for each step
the load generator's arguments, its run as a child and its one-line summary."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tools.toolkit.processes import LOAD_CORE, Proc, pin_prefix, run_json_tool, tool_command
from tools.toolkit.progress import Progress

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
        *tool_command("loadgen"),
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

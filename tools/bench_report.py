"""The figures of a ``tools.bench`` run and its report: one ``Figure`` per metric with its
value per frontend per round, the capacity a frontend kept up with, the load side's worst
CPU, and the markdown table with its ratios."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from tools.bench_plan import (
    CAPACITY_BEGIN,
    KEEP_UP_ITL_PERIODS,
    KEEP_UP_ITL_SLACK_MS,
    KEEP_UP_SHARE,
    TTFT_TOKENS,
    Plan,
    keep_up_itl_ms,
    markers,
)
from tools.toolkit.machine import source_code
from tools.toolkit.reports import DASH, cell, ratios


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

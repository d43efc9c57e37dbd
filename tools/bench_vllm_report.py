"""``tools.bench_vllm``'s figures, goals and the docs/benchmarks.md table."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from tools.toolkit import reports

DASH = reports.DASH


@dataclass
class Row:
    key: str
    label: str
    unit: str
    digits: int
    value: Callable[[dict[str, dict]], float]  # one side's results of one round -> figure


def _usable(result: dict | None) -> bool:
    """A result that counts: no error, and (a load window) its processes stayed put."""
    if not result or "error" in result:
        return False
    return result.get("threads", {}).get("placement_held", True)


def _get(step: str, *path: str) -> Callable[[dict[str, dict]], float]:
    def value(results: dict[str, dict]) -> float:
        result = results.get(step)
        if not _usable(result):
            return math.nan
        found = result
        for name in path:
            if not isinstance(found, dict) or found.get(name) is None:
                return math.nan
            found = found[name]
        return float(found)

    return value


def _pooled(steps: list[str], part: str) -> Callable[[dict[str, dict]], float]:
    """µs of CPU per generated token over every load window of a round; ``part``: the
    non-model processes together ("server") or one of them ("frontend", "adapter")."""

    def value(results: dict[str, dict]) -> float:
        got = [results.get(step) for step in steps]
        if not all(_usable(r) for r in got):
            return math.nan
        if any(f"{part}_cpu_s" not in r for r in got):
            return math.nan  # a process this side does not have
        tokens = sum(r["generated_tokens"] for r in got)
        return 1e6 * sum(r[f"{part}_cpu_s"] for r in got) / tokens if tokens else math.nan

    return value


def rows(plan) -> list[Row]:  # type: ignore[no-untyped-def]
    steps = [f"{kind}:{level}" for kind, level in plan.load_steps()]
    out = [
        Row(
            "cpu_per_token",
            "CPU per generated token outside the model, the load windows pooled",
            "µs",
            1,
            _pooled(steps, "server"),
        ),
        Row(
            "cpu_per_token_frontend",
            "… of which trioserve's frontend",
            "µs",
            1,
            _pooled(steps, "frontend"),
        ),
        Row(
            "cpu_per_token_adapter",
            "… of which the engine adapter",
            "µs",
            1,
            _pooled(steps, "adapter"),
        ),
    ]
    for kind, level in plan.load_steps():
        what = "non-streaming" if kind == "json" else "streaming"
        out.append(
            Row(
                f"cpu_per_token_{kind}_c{level}",
                f"CPU per token, {what} c={level}",
                "µs",
                1,
                _get(f"{kind}:{level}", "server_cpu_us_per_token"),
            )
        )
    for c in plan.json_levels:
        step = f"json:{c}"
        out += [
            Row(
                f"json_c{c}_rps", f"non-streaming c={c}: requests/s", "req/s", 1, _get(step, "rps")
            ),
            Row(
                f"json_c{c}_p50", f"non-streaming c={c}: latency p50", "ms", 1, _get(step, "p50_ms")
            ),
        ]
    for n in plan.stream_levels:
        step = f"stream:{n}"
        out += [
            Row(
                f"stream_c{n}_tps",
                f"streaming c={n}: tokens/s",
                "tok/s",
                0,
                _get(step, "tokens_per_s"),
            ),
            Row(
                f"stream_c{n}_itl50",
                f"streaming c={n}: gap between events p50",
                "ms",
                1,
                _get(step, "itl_p50_ms"),
            ),
            Row(
                f"stream_c{n}_itl99",
                f"streaming c={n}: gap between events p99",
                "ms",
                1,
                _get(step, "itl_p99_ms"),
            ),
            Row(
                f"stream_c{n}_server_cpu",
                f"streaming c={n}: CPU outside the model",
                "% of a core",
                0,
                _get(step, "server_cpu_pct"),
            ),
            Row(
                f"stream_c{n}_model_cpu",
                f"streaming c={n}: the model's CPU (EngineCore, Worker, launcher)",
                "% of a core",
                0,
                _get(step, "model_cpu_pct"),
            ),
        ]

    def others(results: dict[str, dict]) -> float:
        got = [_get(step, "other_cpu_pct")(results) for step in steps]
        got = [g for g in got if not math.isnan(g)]
        return statistics.fmean(got) if got else math.nan

    out.append(
        Row(
            "load_others",
            "everything else's CPU during the load windows (the shared machine), mean",
            "% of a core",
            0,
            others,
        )
    )
    out += [
        Row(
            "ttft_p50",
            f"TTFT p50, c=1 ({plan.ttft_tokens}-token streams)",
            "ms",
            2,
            _get("ttft", "p50_ms"),
        ),
        Row("ttft_p99", "TTFT p99, c=1", "ms", 2, _get("ttft", "p99_ms")),
        Row("ttft_mean", "TTFT mean, c=1", "ms", 2, _get("ttft", "mean_ms")),
        Row(
            "ttft_engine_mean",
            "vLLM's own TTFT (AsyncLLM's histogram), mean",
            "ms",
            2,
            _get("ttft", "engine_mean_ms"),
        ),
        Row(
            "abort_sse_p50",
            "abort, SSE: FIN to the engine's running 0, p50",
            "ms",
            1,
            _get("abort", "sse_p50_ms"),
        ),
        Row("abort_json_p50", "abort, non-streaming: p50", "ms", 1, _get("abort", "json_p50_ms")),
        Row(
            "abort_scrape",
            "abort: one scrape of the metrics (the resolution), p50",
            "ms",
            1,
            _get("abort", "scrape_p50_ms"),
        ),
    ]
    if plan.long_prompt_tokens:
        lp = f"{plan.long_prompt_streams} streams"
        out += [
            Row(
                "long_itl99_before",
                f"{lp}, no long prompt: inter-token p99 (window before)",
                "ms",
                1,
                _get("long_prompt", "windows", "before", "itl_p99_ms"),
            ),
            Row(
                "long_itl99_with",
                f"{lp}, long prompts arriving back to back: inter-token p99",
                "ms",
                1,
                _get("long_prompt", "windows", "with", "itl_p99_ms"),
            ),
            Row(
                "long_itl99_after",
                f"{lp}, no long prompt: inter-token p99 (window after)",
                "ms",
                1,
                _get("long_prompt", "windows", "after", "itl_p99_ms"),
            ),
            Row(
                "long_itl_max_with",
                f"{lp}, long prompts arriving: longest inter-token gap",
                "ms",
                1,
                _get("long_prompt", "windows", "with", "itl_max_ms"),
            ),
            Row(
                "long_itl99_ratio",
                "inter-token p99 with long prompts / the worse window without",
                "ratio",
                2,
                _get("long_prompt", "itl_p99_ratio"),
            ),
            Row(
                "long_prompt_ms",
                "a long prompt's answer (the 400 for its length), p50",
                "ms",
                0,
                _get("long_prompt", "long_prompt_p50_ms"),
            ),
        ]
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if not (math.isnan(a) or math.isnan(b) or b == 0) else math.nan


def figures_of(plan, rounds: list[dict], labels: list[str], reference: str) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    out = {}
    for row in rows(plan):
        values = {label: [row.value(rnd.get(label, {})) for rnd in rounds] for label in labels}
        ratios = {
            label: [_ratio(a, b) for a, b in zip(values[label], values[reference], strict=True)]
            for label in labels
            if label != reference and reference in values
        }
        out[row.key] = {
            "label": row.label,
            "unit": row.unit,
            "digits": row.digits,
            "values": values,
            "ratios": ratios,
        }
    return out


def verdict(ratios: list[float], target: float, at_most: bool) -> str:
    """ "met" only when every round (two or more) meets the goal; "not met" when none does."""
    good = [x for x in ratios if not math.isnan(x)]
    if not good:
        return "no figure"
    meets = [(x <= target) if at_most else (x >= target) for x in good]
    if len(good) < 2:
        return "undecided (one round)"
    if all(meets):
        return "met"
    if not any(meets):
        return "not met"
    return "undecided (the rounds straddle the goal)"


#: Goals (issue 25): figure key -> (the ratio side / vLLM, at most (True) or at least
#: (False)).
GOALS = {
    "cpu_per_token": (0.3, True),
    "ttft_p50": (0.9, True),
    "json_c32_rps": (1.5, False),
    "stream_c256_tps": (1.2, False),
}


def goals_of(figures: dict[str, dict]) -> dict[str, dict]:
    """Each side's verdict on each goal whose figure was measured (a run of other levels,
    ``--json-levels 8`` say, has no figure for the goal at c=32: it is left out, and the
    report says so)."""
    out: dict[str, dict] = {}
    for key, (target, at_most) in GOALS.items():
        if key not in figures:
            continue
        for label, ratios in figures[key]["ratios"].items():
            good = [x for x in ratios if not math.isnan(x)]
            said = verdict(ratios, target, at_most)
            out.setdefault(label, {})[key] = {
                "label": figures[key]["label"],
                "target": f"{'≤' if at_most else '≥'} {target:g}",
                "ratio": statistics.median(good) if good else math.nan,
                "range": [min(good), max(good)] if good else [],
                "ratios": ratios,
                "verdict": said,
                "met": said == "met",
            }
    return out


def placement_of(rounds: list[dict]) -> dict[str, list[str]]:
    """Per side, what left its place in any load window (empty: it held throughout)."""
    out: dict[str, list[str]] = {}
    for r, rnd in enumerate(rounds):
        for label, steps in rnd.items():
            out.setdefault(label, [])
            for step, result in steps.items():
                for what in (result.get("threads") or {}).get("escaped", []):
                    out[label].append(f"round {r + 1}, {step}: {what}")
    return out


def _range(goal: dict, digits: int = 2) -> str:
    lo, hi = (goal["range"] + [math.nan, math.nan])[:2]
    if math.isnan(lo) or lo == hi:
        return ""
    return f" (rounds {reports.fmt(lo, digits)}{DASH}{reports.fmt(hi, digits)})"


def report(  # type: ignore[no-untyped-def]
    plan,
    meta: dict,
    figures: dict[str, dict],
    goals: dict[str, dict],
    labels: list[str],
    reference: str,
) -> str:
    m = meta["machine"]
    others = [label for label in labels if label != reference]
    null = meta.get("engine") == "null"
    engine = "the null engine" if null else "the model"
    lines = [
        meta["begin"],
        "### The null engine's table (the frontends alone)"
        if null
        else "## vLLM: trioserve's direct and shared paths against vLLM's own API server",
        "",
        f"Measured {meta['date']}, code {meta['commit']} (git HEAD + a hash of the package as "
        f"the processes loaded it) on {m['cpu']}, {m['cores']} cores, {m['memory']}, Linux "
        f"{m['kernel']}, Python {m['python']}, vLLM {meta['vllm']}, with `{meta['command']}` "
        f"({meta['duration_s'] / 60:.1f} minutes). Load average (a machine shared with other "
        f"agents' work) {meta['loadavg_start']} at the start, {meta['loadavg_end']} at the end.",
        "",
    ]
    for label in labels:
        commands = "` and `".join(meta["commands"][label])
        procs = meta["processes"][label]
        counted = ", ".join(f"{n} ({w})" for n, w in procs["counted"].items())
        excluded = ", ".join(f"{n} ({w})" for n, w in procs["excluded"].items()) or "none"
        lines.append(
            f"- {label}: `{commands}`. CPU counted: {counted}; {engine} (measured apart, not "
            f"counted): {excluded}."
        )
    lines += [
        f"- Same vLLM options and environment on every side ({meta['env']}). Pinning: "
        f"{meta['pinning']}. Placement checked in every load window (each thread's cores, "
        f"sampled, and affinity; the processes of each side's trees): "
        + "; ".join(
            f"{label} "
            + (
                "held"
                if not meta["placement"][label]
                else f"**did not hold** "
                f"({len(meta['placement'][label])} findings, those windows left out; JSON)"
            )
            for label in labels
        )
        + ".",
        f"- {plan.rounds} round(s), the sides' order rotating; each cell the median over rounds "
        f"(min{DASH}max), the ratio columns side / {reference} per round. Windows: "
        f"{plan.json_duration:g} s after {plan.json_warmup:g} s (non-streaming, "
        f"{plan.json_tokens} tokens an answer), {plan.stream_duration:g} s after "
        f"{plan.stream_warmup:g} s (streaming, {plan.stream_tokens} tokens an answer, the next "
        "on the same connection); every request greedy with `ignore_eos`. Tokens: a "
        "non-streaming answer's `max_tokens` (exact); streamed, the engine's own count over "
        "the window (`vllm:generation_tokens_total`; the direct path's "
        "`trioserve_engine_generation_tokens_total`, both counted step by step), since a "
        "streamed event may carry several tokens; gaps are between a stream's events as the "
        f"client read them. TTFT: {plan.ttft_count} streaming requests a side and "
        f"round, one at a time, each side alone. Abort: {plan.abort_count} SSE and "
        f"{plan.abort_count} non-streaming a side and round; the engine's running count polled "
        f"every {plan.abort_poll_ms:g} ms plus a scrape.",
        f"- Same greedy answer from every side: {'yes' if meta['same_answer'] else '**no**'}.",
        "",
        "| figure | "
        + " | ".join(labels)
        + " | "
        + " | ".join(f"{o} / vLLM" for o in others)
        + " |",
        "|---|" + "---|" * (len(labels) + len(others)),
    ]
    for figure in figures.values():
        values = figure["values"]
        cells = [reports.cell(values[label], figure["digits"]) for label in labels]
        ratio_cells = [
            ", ".join(f"{x:.2f}" if not math.isnan(x) else "—" for x in figure["ratios"][o])
            for o in others
        ]
        lines.append(
            f"| {figure['label']} ({figure['unit']}) | " + " | ".join(cells + ratio_cells) + " |"
        )
    lines += ["", f"Goals (side / {reference}; met only when every round of two or more is):", ""]
    unmeasured = [key for key in GOALS if key not in figures]
    if unmeasured:
        lines += [f"- not measured in this run (its level was not run): {', '.join(unmeasured)}"]
    for label in others:
        for goal in goals.get(label, {}).values():
            said = goal["verdict"]
            shown = said if said == "met" else f"**{said}**"
            lines.append(
                f"- {label}, {goal['label']}: {reports.fmt(goal['ratio'], 2)}{_range(goal)} "
                f"(goal {goal['target']}): {shown}"
            )
    if meta["failures"]:
        lines += ["", "Runs that failed:", ""] + [f"- {f}" for f in meta["failures"]]
    lines.append(meta["end"])
    return "\n".join(lines)


def summarize(kind: str, result: dict) -> str:
    if "error" in result:
        return ""
    if kind in ("json", "stream"):
        rate = (
            f"{result['rps']:.1f} req/s, p50 {result['p50_ms']:.0f} ms"
            if kind == "json"
            else f"ITL p50 {result['itl_p50_ms']:.0f} ms"
        )
        parts = ", ".join(
            f"{name} {p['cpu_pct']:.0f}%" for name, p in result["threads"]["processes"].items()
        )
        return (
            f"{rate}, {result['tokens_per_s']:.0f} tokens/s, "
            f"{result['server_cpu_us_per_token']:.0f} µs CPU/token (non-model "
            f"{result['server_cpu_pct']:.0f}% of a core; {parts}; others "
            f"{result['other_cpu_pct']:.0f}%)"
        )
    if kind == "ttft":
        return (
            f"p50 {result['p50_ms']:.1f} ms, mean {result['mean_ms']:.1f} ms, vLLM's own "
            f"mean {result['engine_mean_ms']:.1f} ms"
        )
    if kind == "long_prompt":
        w = result["windows"]
        return (
            f"ITL p99 {w['before']['itl_p99_ms']:.0f} / {w['with']['itl_p99_ms']:.0f} / "
            f"{w['after']['itl_p99_ms']:.0f} ms (before / with / after), "
            f"{result['long_prompts']} long prompts, {result['long_prompt_p50_ms']:.0f} ms "
            f"each, answered {result['long_prompt_statuses']}"
        )
    return (
        f"SSE p50 {result['sse_p50_ms']:.1f} ms (max {result['sse_max_ms']:.1f}), JSON p50 "
        f"{result['json_p50_ms']:.1f} ms (max {result['json_max_ms']:.1f}); a scrape takes "
        f"{result['scrape_p50_ms']:.1f} ms"
    )


def gist(answer: dict) -> str:
    """What two servers answering the same greedy request must agree on."""
    choice = (answer.get("choices") or [{}])[0]
    usage = answer.get("usage") or {}
    return json.dumps(
        [
            (choice.get("message") or {}).get("content"),
            choice.get("finish_reason"),
            usage.get("prompt_tokens"),
            usage.get("completion_tokens"),
        ]
    )

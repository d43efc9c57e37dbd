"""``trioserve run``'s tool-call and reasoning options (``--tool-call-parser NAME``,
``--reasoning-parser NAME``, ``--tool-strict-level LEVEL``: ``config.Settings``;
``--enable-auto-tool-choice``, accepted: a named tool-call parser turns ``auto`` on),
checked together, for every engine.

With ``--vllm``, the same options inside ``--vllm-args`` are the frontend's too (it is
the frontend that parses answers; vLLM's engine would only ignore them), so they are
read out of it here: the tool-call options leave the engine's arguments, and
``--reasoning-parser`` stays in them as well (vLLM's structured outputs start after
the reasoning ends, which the engine needs it for) and is given to the engine when only
the frontend's option names it.
"""

from __future__ import annotations

import attrs

from ..text.agents import REASONING_PARSERS, TOOL_CALL_PARSERS
from ..text.agents.structural_tags import TOOL_STRICT_LEVELS


class FlagError(ValueError):
    """A mistake in these options, said in one line."""


@attrs.frozen
class ParserFlags:
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    tool_strict_level: str = "auto"
    #: With ``--vllm``: the engine's arguments, once the frontend's are taken out.
    engine_args: list[str] = attrs.Factory(list)


def _take(args: list[str], name: str, has_value: bool) -> tuple[list[str], list[str | None]]:
    """``args`` without option ``name`` (``--name VALUE``, ``--name=VALUE``, or a
    switch), and the values it had."""
    rest: list[str] = []
    values: list[str | None] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == name:
            if has_value:
                if i + 1 >= len(args):
                    raise FlagError(f"--vllm-args: {name} needs a value")
                values.append(args[i + 1])
                i += 2
                continue
            values.append(None)
        elif has_value and arg.startswith(name + "="):
            values.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    return rest, values


def _one(option: str, own: str | None, inside: list[str | None]) -> str:
    names = {v for v in inside if v}
    if own:
        names.add(own)
    if len(names) > 1:
        raise FlagError(f"{option} is given twice, differently: {', '.join(sorted(names))}")
    return names.pop() if names else ""


def resolve(
    tool_call_parser: str,
    reasoning_parser: str,
    auto: bool,
    vllm_args: list[str] | None,
    tool_strict_level: str = "auto",
) -> ParserFlags:
    """The frontend's formats from the options (and from ``--vllm-args`` when the
    engine is vLLM: ``vllm_args``, split), checked against the formats there are."""
    engine_args = list(vllm_args or [])
    tool_inside: list[str | None] = []
    reasoning_inside: list[str | None] = []
    auto_inside: list[str | None] = []
    strict_inside: list[str | None] = []
    if vllm_args is not None:
        engine_args, tool_inside = _take(engine_args, "--tool-call-parser", True)
        engine_args, strict_inside = _take(engine_args, "--tool-strict-level", True)
        engine_args, auto_inside = _take(engine_args, "--enable-auto-tool-choice", False)
        _, reasoning_inside = _take(engine_args, "--reasoning-parser", True)
    tool = _one("--tool-call-parser", tool_call_parser, tool_inside)
    reasoning = _one("--reasoning-parser", reasoning_parser, reasoning_inside)
    if tool and tool not in TOOL_CALL_PARSERS:
        raise FlagError(
            f"--vllm-args: --tool-call-parser {tool!r} is not a format trioserve parses; "
            "it knows " + ", ".join(sorted(TOOL_CALL_PARSERS))
        )
    if reasoning and reasoning not in REASONING_PARSERS:
        raise FlagError(
            f"--vllm-args: --reasoning-parser {reasoning!r} is not a format trioserve "
            "parses; it knows " + ", ".join(sorted(REASONING_PARSERS))
        )
    own_strict = tool_strict_level if tool_strict_level != "auto" else None
    strict = _one("--tool-strict-level", own_strict, strict_inside) or "auto"
    if strict not in TOOL_STRICT_LEVELS:
        raise FlagError(
            f"--vllm-args: --tool-strict-level {strict!r}: give " + ", ".join(TOOL_STRICT_LEVELS)
        )
    if (auto or auto_inside) and not tool:
        raise FlagError("--enable-auto-tool-choice needs --tool-call-parser NAME")
    if vllm_args is not None and reasoning and not reasoning_inside:
        engine_args += ["--reasoning-parser", reasoning]
    return ParserFlags(tool, reasoning, strict, engine_args)

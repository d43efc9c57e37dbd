"""--tool-call-parser, --reasoning-parser, --tool-strict-level and --enable-auto-tool-choice
on the command line, and the same options inside --vllm-args: the frontend's, never
silently ignored."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trioserve.cli import build_parser
from trioserve.cli.agent_flags import FlagError, resolve


def test_the_options_parse_into_the_settings():
    args = build_parser().parse_args(
        ["run", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"]
    )
    assert (args.tool_call_parser, args.reasoning_parser) == ("hermes", "qwen3")
    assert not build_parser().parse_args(["run"]).tool_call_parser


def test_vllm_args_tool_options_are_the_frontends_and_leave_the_engines_args():
    flags = resolve(
        "",
        "",
        False,
        ["--max-model-len", "512", "--enable-auto-tool-choice", "--tool-call-parser=hermes",
         "--reasoning-parser", "deepseek_r1"],
    )  # fmt: skip
    assert (flags.tool_call_parser, flags.reasoning_parser) == ("hermes", "deepseek_r1")
    # vLLM's engine gates structured outputs on the reasoning's end: it keeps that one.
    assert flags.engine_args == ["--max-model-len", "512", "--reasoning-parser", "deepseek_r1"]


def test_the_frontends_reasoning_parser_is_given_to_the_vllm_engine_too():
    flags = resolve("hermes", "qwen3", False, ["--dtype", "float32"])
    assert flags.engine_args == ["--dtype", "float32", "--reasoning-parser", "qwen3"]
    assert resolve("hermes", "qwen3", False, None).engine_args == []


def test_the_tool_strict_level_is_the_frontends_on_the_command_line_or_in_vllm_args():
    args = build_parser().parse_args(["run", "--tool-strict-level", "parameter"])
    assert args.tool_strict_level == "parameter"
    assert build_parser().parse_args(["run"]).tool_strict_level == "auto"
    inside = resolve("hermes", "", False, ["--tool-strict-level", "function", "--dtype", "half"])
    assert inside.tool_strict_level == "function"
    assert inside.engine_args == ["--dtype", "half"]  # the frontend's: not the engine's
    assert resolve("hermes", "", False, None, "parameter").tool_strict_level == "parameter"
    with pytest.raises(FlagError, match="given twice"):
        resolve("hermes", "", False, ["--tool-strict-level=function"], "parameter")
    with pytest.raises(FlagError, match="give auto, function, parameter"):
        resolve("hermes", "", False, ["--tool-strict-level", "everything"])


@pytest.mark.parametrize(
    ("own", "inside", "message"),
    [
        ("mistral", ["--tool-call-parser", "hermes"], "given twice"),
        ("", ["--tool-call-parser", "pythonic"], "not a format trioserve parses"),
        ("", ["--enable-auto-tool-choice"], "needs --tool-call-parser"),
        ("", ["--tool-call-parser"], "needs a value"),
    ],
)
def test_mistakes_are_one_line(own, inside, message):
    with pytest.raises(FlagError, match=message):
        resolve(own, "", False, inside)


def test_the_cli_says_a_mistake_in_one_line_and_exits_2():
    result = subprocess.run(
        [sys.executable, "-m", "trioserve", "run", "--enable-auto-tool-choice"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs --tool-call-parser" in lines[0]

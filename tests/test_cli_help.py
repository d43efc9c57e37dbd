"""`trioserve --help` and every command's: each option explained, each default said once,
the drain's timing rule the same as docs/deployment.md's."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trioserve.cli import GRACE_RULE, build_parser
from trioserve.config import Settings
from trioserve.server.frontend import hard_stop_after

DOCS = Path(__file__).parents[1] / "docs"


def parsers(
    parser: argparse.ArgumentParser, name: str = "trioserve"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command line, by its command: the top level, then each command's."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, subparser in action.choices.items():
                yield from parsers(subparser, f"{name} {command}")


def test_the_walk_finds_every_command():
    names = [name for name, _ in parsers(build_parser())]
    assert names == [
        "trioserve",
        "trioserve run",
        "trioserve client",
        "trioserve keygen",
        "trioserve engine",
        "trioserve engine mock",
        "trioserve engine vllm",
    ]


@pytest.mark.parametrize(("name", "parser"), list(parsers(build_parser())))
def test_every_option_and_argument_has_help(name, parser):
    for action in parser._actions:
        label = "/".join(action.option_strings) or action.dest
        assert action.help and action.help != argparse.SUPPRESS, f"{name} {label}"


def help_entries(text: str) -> dict[str, str]:
    """Each option's (or argument's) entry of a rendered help, by its first line."""
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if re.match(r"  \S", line):  # an option or argument starts
            current = line.split()[0]
            entries[current] = line
        elif current and line.startswith("    "):  # its help goes on
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize(("name", "parser"), list(parsers(build_parser())))
def test_each_default_is_said_once_and_never_as_none(name, parser):
    entries = help_entries(parser.format_help())
    assert entries, name
    for option, entry in entries.items():
        assert entry.count("(default") <= 1, f"{name} {option}: {entry}"
        assert "default: None" not in entry and "default: []" not in entry, entry


def test_numbers_show_their_default_and_help_that_names_it_does_not_repeat_it():
    run = help_entries(build_parser()._subparsers._group_actions[0].choices["run"].format_help())
    assert run["--port"].endswith("(default: 8000)")
    assert run["--max-connections"].endswith("(default: 0)")  # 0 is a value, not "none"
    assert run["--upload-dir"].count("default") == 1  # the help says it in words


def test_the_client_help_never_shows_the_api_key_of_the_environment():
    env = {"TRIOSERVE_API_KEY": "sk-secret-from-env", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "trioserve", "client", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert "sk-secret" not in result.stdout
    assert "$TRIOSERVE_API_KEY" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-level", "debug", "run"],
        ["run", "--log-level", "debug"],
        ["client", "hi", "--log-level", "debug"],
        ["engine", "--log-level", "debug", "mock"],
        ["engine", "mock", "--log-level", "debug"],
        ["engine", "vllm", "m", "--log-level", "debug"],
    ],
)
def test_log_level_is_taken_before_or_after_the_command(argv):
    args, _ = build_parser().parse_known_args(argv)
    assert args.log_level == "debug"


def test_log_level_defaults_to_info_wherever_it_could_be():
    for argv in (["run"], ["client", "hi"], ["engine", "mock"]):
        assert build_parser().parse_args(argv).log_level == "info"


def squeeze(text: str) -> str:
    return " ".join(text.split())


def test_the_grace_period_formula_is_one_in_the_help_and_in_the_deployment_doc():
    run_help = squeeze(build_parser()._subparsers._group_actions[0].choices["run"].format_help())
    assert squeeze(GRACE_RULE) in run_help
    assert f"    {GRACE_RULE}\n" in (DOCS / "deployment.md").read_text()


@pytest.mark.parametrize(("drain_delay", "graceful_timeout"), [(5, 30), (0, 0), (20, 10)])
def test_the_grace_formula_is_when_the_server_stops_at_the_latest(drain_delay, graceful_timeout):
    # The listener closes drain_delay after the signal (at once under a second signal or
    # SIGINT, which only comes sooner); the server's hard stop follows hard_stop_after().
    margin = float(GRACE_RULE.rsplit("+", 1)[1])
    settings = Settings(drain_delay=drain_delay, graceful_timeout=graceful_timeout)
    latest_exit = drain_delay + hard_stop_after(settings)
    assert latest_exit == max(drain_delay, graceful_timeout) + margin


def test_the_run_help_says_what_ctrl_c_does():
    text = squeeze(build_parser()._subparsers._group_actions[0].choices["run"].format_help())
    assert "SIGINT (Ctrl-C) drains the same way but skips --drain-delay" in text
    assert "(SIGINT, Ctrl-C at a terminal, skips it)" in text

"""`trioserve run`'s options are derived from Settings, RunOptions and the mock's
MockOptions (options.py): every field is an option, its default the field's, its unit
converted, each in a group of `run --help`; the --mock-* options reach the mock as given."""

from __future__ import annotations

import os

import attrs
import pytest

from trioserve.cli import build_parser
from trioserve.cli.run import GROUPS, MOCK_PREFIX, RunOptions, _child_engine
from trioserve.config import Settings
from trioserve.engine import routing
from trioserve.engine_programs.mock_program import MockOptions
from trioserve.engine_programs.process import ProcessOptions
from trioserve.options import described_fields, from_args


def run_parser():
    return build_parser()._subparsers._group_actions[0].choices["run"]


def parse(*argv: str):
    return build_parser().parse_args(["run", *argv])


@pytest.mark.parametrize("cls", [Settings, RunOptions])
def test_every_field_is_an_option(cls):
    described = {field.name for field, _ in described_fields(cls)}
    assert described == {field.name for field in attrs.fields(cls)}


@pytest.mark.parametrize("cls", [Settings, RunOptions])
def test_no_option_given_is_every_default(cls):
    assert from_args(cls, parse()) == cls()


def test_an_option_in_a_unit_is_stored_in_the_fields_unit():
    settings = from_args(Settings, parse("--max-body-mb", "0.5", "--ws-max-message-kb", "2"))
    assert settings.max_body_bytes == 2**19
    assert settings.ws_max_message_bytes == 2048


def test_switches_on_and_off_and_repeatable_options():
    settings = from_args(
        Settings,
        parse("--no-playground", "--no-access-log", "--debug-endpoints", "--engine",
              "tcp://127.0.0.1:9", "--engine", "ipc:///tmp/e", "--cors-origin", "*"),
    )  # fmt: skip
    assert not settings.playground and not settings.access_log and settings.debug_endpoints
    assert settings.engines == ["tcp://127.0.0.1:9", "ipc:///tmp/e"]
    assert settings.cors_origins == ["*"]


def test_a_string_option_not_given_is_the_fields_default_and_given_is_itself():
    assert from_args(Settings, parse()).ssl_client_cert == "required"
    args = parse("--ssl-client-cert", "optional", "--engine-dns-server", "10.0.0.1:53")
    settings = from_args(Settings, args)
    assert (settings.ssl_client_cert, settings.engine_dns_server) == ("optional", "10.0.0.1:53")


def test_the_routing_choices_are_the_routing_policies():
    [choices] = [d.choices for f, d in described_fields(Settings) if f.name == "routing"]
    assert tuple(choices) == routing.POLICIES


def test_the_help_shows_every_group_in_order_each_with_its_options():
    text = run_parser().format_help()
    places = [text.index(f"\n{title}:\n") for title in GROUPS.values()]
    assert places == sorted(places)
    used = {d.group for cls in (Settings, RunOptions) for _, d in described_fields(cls)}
    used |= {d.group for _, d in described_fields(MockOptions, MOCK_PREFIX)}
    assert used == set(GROUPS)


def test_a_default_is_shown_as_typed_with_the_unit_as_metavar():
    text = " ".join(run_parser().format_help().split())
    assert "--request-timeout SECONDS deadline of every generation request" in text
    assert "X-Request-Timeout header (default: 600)" in text
    assert "--max-body-mb MiB largest request body in MiB (413 past it) (default: 128)" in text


def mock_started_by(*argv: str) -> tuple[MockOptions, ProcessOptions]:
    """The options the mock that `run ARGV` starts reads from its command line."""
    args = parse(*argv)
    child = _child_engine(args, from_args(RunOptions, args), "ipc:///tmp/engine.sock", [])
    [_python, dash_m, trioserve, *rest] = child.command
    assert (dash_m, trioserve) == ("-m", "trioserve")
    started = build_parser().parse_args(rest)
    assert (started.command, started.engine_kind) == ("engine", "mock")
    return from_args(MockOptions, started), from_args(ProcessOptions, started)


def test_the_mock_options_given_to_run_reach_the_mock_it_starts():
    mock, process = mock_started_by(
        "--mock-tokens-per-second", "7.5", "--mock-ttft-ms", "0", "--mock-model", "m",
        "--mock-answer-tokens", "3", "--mock-fault-injection",
    )  # fmt: skip
    assert mock == MockOptions(
        tokens_per_second=7.5, ttft_ms=0, model="m", answer_tokens=3, allow_fault_injection=True
    )
    assert process.bind == "ipc:///tmp/engine.sock"
    assert process.exit_with_parent == os.getpid()


def test_the_mock_run_starts_by_default_is_the_mocks_default():
    mock, _ = mock_started_by()
    assert mock == MockOptions()

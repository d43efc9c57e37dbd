"""`trioserve run`'s options are derived from Settings and RunOptions (options.py): every
field is an option, its default the field's, its unit converted, each in a group of
`run --help`."""

from __future__ import annotations

import attrs
import pytest

from trioserve.cli import build_parser
from trioserve.cli.run import GROUPS, RunOptions
from trioserve.config import Settings
from trioserve.engine import routing
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
    assert used == set(GROUPS)


def test_a_default_is_shown_as_typed_with_the_unit_as_metavar():
    text = " ".join(run_parser().format_help().split())
    assert "--request-timeout SECONDS deadline of every generation request" in text
    assert "X-Request-Timeout header (default: 600)" in text
    assert "--max-body-mb MiB largest request body in MiB (413 past it) (default: 128)" in text

"""The response store's bounds on the command line (docs/api.md, "Bounds of the response
store"), with the defaults of Settings."""

from __future__ import annotations

import pytest

from tests.helpers.processes import free_port
from trioserve.cli import build_parser, main
from trioserve.config import Settings


def test_defaults_are_the_settings_defaults():
    args = build_parser().parse_args(["run"])
    defaults = Settings()
    assert args.responses_ttl == defaults.responses_ttl == 600.0
    assert args.responses_max_events == defaults.responses_max_events == 16384
    assert args.max_background_responses == defaults.max_background_responses == 64
    assert args.responses_store_mb * 2**20 == defaults.responses_store_bytes == 256 * 2**20


def test_values():
    args = build_parser().parse_args(
        ["run", "--responses-ttl", "30", "--responses-max-events", "100",
         "--max-background-responses", "2", "--responses-store-mb", "0.5"]
    )  # fmt: skip
    assert (args.responses_ttl, args.responses_max_events) == (30.0, 100)
    assert (args.max_background_responses, args.responses_store_mb) == (2, 0.5)


@pytest.mark.parametrize(
    "option",
    ["--responses-ttl", "--responses-max-events", "--max-background-responses",
     "--responses-store-mb"],
)  # fmt: skip
def test_a_bound_must_be_positive(option, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", option, "0"])
    assert exit_.value.code == 2
    assert "must be positive" in capsys.readouterr().err


def test_run_hands_the_bounds_to_the_server(monkeypatch):
    seen = []

    async def serve_frontend(settings, **_):
        seen.append(settings)

    monkeypatch.setattr("trioserve.server.frontend.serve_frontend", serve_frontend)
    monkeypatch.setattr("trioserve.cli.run.tune_gc", lambda: None)
    status = main(
        ["run", "--port", str(free_port()), "--engine", "tcp://127.0.0.1:9",
         "--responses-ttl", "30", "--responses-max-events", "100",
         "--max-background-responses", "2", "--responses-store-mb", "0.5"]
    )  # fmt: skip
    assert status == 0
    [settings] = seen
    assert (settings.responses_ttl, settings.responses_max_events) == (30.0, 100)
    assert settings.max_background_responses == 2
    assert settings.responses_store_bytes == 2**19

"""The serving options of issue 7 on the command line, with their defaults."""

from __future__ import annotations

import pytest

from trioserve.cli import build_parser


def test_defaults():
    args = build_parser().parse_args(["run"])
    assert args.max_concurrent_requests == 256
    assert args.sse_keepalive == 15.0
    assert args.cors_origin == [] and not args.cors_allow_credentials
    assert not args.allow_remote_media
    assert args.max_body_mb == 128
    assert args.body_timeout == 30.0


def test_values_and_repeatable_origins():
    args = build_parser().parse_args(
        ["run", "--max-concurrent-requests", "3", "--cors-origin", "https://a.example",
         "--cors-origin", "https://b.example", "--cors-allow-credentials", "--sse-keepalive",
         "0", "--upload-dir", "/srv/uploads", "--allow-remote-media", "--remote-media-max-mb",
         "2", "--remote-media-timeout", "4", "--body-timeout", "7"]
    )  # fmt: skip
    assert args.max_concurrent_requests == 3
    assert args.cors_origin == ["https://a.example", "https://b.example"]
    assert args.cors_allow_credentials and args.allow_remote_media
    assert (args.sse_keepalive, args.upload_dir) == (0.0, "/srv/uploads")
    assert (args.remote_media_max_mb, args.remote_media_timeout, args.body_timeout) == (2, 4, 7)


def test_engine_addresses_are_checked_when_parsed(capsys):
    args = build_parser().parse_args(
        ["run", "--engine", "tcp://10.0.0.5:5555", "--engine", "ipc:///tmp/e.sock"]
    )
    assert args.engine == ["tcp://10.0.0.5:5555", "ipc:///tmp/e.sock"]
    for bad in ("inproc://x", "tcp://10.0.0.5", "10.0.0.5:5555"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["run", "--engine", bad])
        assert exit_.value.code == 2  # a usage error, not a traceback at start-up
        assert "expected tcp://HOST:PORT or ipc://PATH" in capsys.readouterr().err

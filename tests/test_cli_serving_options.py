"""The serving options of issue 7 on the command line, with their defaults."""

from __future__ import annotations

import os

import pytest

from trioserve.cli import build_parser, vllm_cpus


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


def test_vllm_cpus_leave_the_last_cpu_to_the_frontend_by_default(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert build_parser().parse_args(["run", "--vllm", "m"]).vllm_cpus == "auto"
    assert vllm_cpus("auto") == {0, 1, 2}
    assert vllm_cpus("all") is None
    assert vllm_cpus("0-1,3") == {0, 1, 3}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    assert vllm_cpus("auto") is None  # one CPU: nothing to leave


@pytest.mark.parametrize("spec", ["x", "3-", "0-9", ""])
def test_a_vllm_cpu_list_that_cannot_be_is_a_usage_error(monkeypatch, capsys, spec):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "--vllm", "m", "--vllm-cpus", spec])
    assert exit_.value.code == 2
    assert "--vllm-cpus" in capsys.readouterr().err

"""`trioserve run --api-key / --api-key-file / TRIOSERVE_API_KEY` as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
import trio

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.processes import Proc
from tests.helpers.waiting import HANG_GUARD
from trioserve.cli import build_parser
from trioserve.engine_programs.mock import expected_text


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trioserve", "run", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env={**os.environ, **(env or {})},
    )


def test_the_options_parse_and_keys_repeat():
    args = build_parser().parse_args(["run"])
    assert (args.api_key, args.api_key_file, args.metrics_require_key) == ([], None, False)
    args = build_parser().parse_args(
        ["run", "--api-key", "a", "--api-key", "b", "--api-key-file", "/k", "--metrics-require-key"]
    )
    assert (args.api_key, args.api_key_file, args.metrics_require_key) == (["a", "b"], "/k", True)


def test_help_describes_the_key_options():
    out = run("--help").stdout
    for text in (
        "--api-key KEY",
        "--api-key-file PATH",
        "--metrics-require-key",
        "TRIOSERVE_API_KEY",
    ):
        assert text in out


@pytest.mark.parametrize(
    ("make_args", "status", "message"),
    [
        # A file that cannot be used: the environment's fault, status 1.
        (lambda tmp: ["--api-key-file", str(tmp / "missing")], 1, "cannot read the API key file"),
        (lambda tmp: ["--api-key-file", str(tmp)], 1, "cannot read the API key file"),
        (lambda tmp: ["--api-key-file", str(tmp / "empty")], 1, "holds no key"),
        (lambda tmp: ["--api-key-file", str(tmp / "bad")], 1, "bad, line 1: an API key must"),
        # A key on the command line that cannot be one: a usage error, status 2.
        (lambda tmp: ["--api-key", ""], 2, "an API key cannot be empty"),
        (lambda tmp: ["--api-key", "two words"], 2, "printable ASCII without spaces"),
    ],
)
def test_an_unusable_key_is_a_clear_error_not_a_traceback(tmp_path, make_args, status, message):
    (tmp_path / "empty").write_text("# no keys yet\n\n")
    (tmp_path / "bad").write_text("two words\n")
    result = run(*make_args(tmp_path), "--engine", "tcp://127.0.0.1:1")
    assert result.returncode == status
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


def test_an_unusable_environment_key_is_a_clear_error():
    result = run("--engine", "tcp://127.0.0.1:1", env={"TRIOSERVE_API_KEY": "a b"})
    assert result.returncode == 2
    assert "TRIOSERVE_API_KEY" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.integration
async def test_keys_from_the_command_line_a_file_and_the_environment_all_work(nursery, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# the team's keys\n\nsk-from-file\n")
    frontend = await Proc.start(
        nursery,
        "run",
        "--port",
        "0",
        "--api-key",
        "sk-from-cli",
        "--api-key-file",
        str(keys),
        env={**os.environ, "TRIOSERVE_API_KEY": "sk-from-env"},
    )
    url = (await frontend.wait_for_output(r"Running on (http://127\.0\.0\.1:\d+)")).group(1)
    body = {"prompt": "x", "max_tokens": 1}
    async with httpx.AsyncClient(base_url=url.decode(), timeout=HANG_GUARD) as client:
        for key in ("sk-from-cli", "sk-from-file", "sk-from-env"):
            ok = await client.post(
                "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}
            )
            assert ok.status_code == 200, key
        refused = await client.post("/v1/completions", json=body)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert (await client.get("/health")).status_code == 200
    await frontend.wait_for_output("API keys required: 3 configured")
    await frontend.stop()
    assert b"sk-from" not in frontend.output  # never a key in the log


@pytest.mark.integration
@pytest.mark.parametrize("transport", [[], ["--sse"]], ids=["websocket", "sse"])
async def test_trioserve_client_sends_its_api_key(nursery, transport):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server="builtin", api_keys=["sk-client"])
    args = ["client", "hi", "--url", frontend.url, "--max-tokens", "3", *transport]
    env = {k: v for k, v in os.environ.items() if k != "TRIOSERVE_API_KEY"}
    ok = await trio.run_process(
        [sys.executable, "-m", "trioserve", *args, "--api-key", "sk-client"],
        capture_stdout=True, capture_stderr=True, check=False, env=env,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.decode() == expected_text("hi", 3) + "\n"
    from_env = await trio.run_process(
        [sys.executable, "-m", "trioserve", *args],
        capture_stdout=True, capture_stderr=True, check=False,
        env={**env, "TRIOSERVE_API_KEY": "sk-client"},
    )  # fmt: skip
    assert from_env.returncode == 0, from_env.stderr
    refused = await trio.run_process(
        [sys.executable, "-m", "trioserve", *args, "--api-key", "sk-wrong"],
        capture_stdout=True, capture_stderr=True, check=False, env=env,
    )  # fmt: skip
    assert refused.returncode == 1
    assert b"Traceback" not in refused.stderr
    # Both servers answer a refused handshake with the 401 and its body (docs/api.md#api-keys).
    [line] = refused.stderr.splitlines()
    assert line.startswith(b"error 401: ") and b"the API key is not valid" in line

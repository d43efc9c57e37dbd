"""`trioserve run --api-key / --api-key-file / TRIOSERVE_API_KEY` as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.conftest import HANG_GUARD
from tests.processes import Proc
from trioserve.cli import build_parser


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
    ("make_args", "message"),
    [
        (lambda tmp: ["--api-key-file", str(tmp / "missing")], "cannot read the API key file"),
        (lambda tmp: ["--api-key-file", str(tmp)], "cannot read the API key file"),
        (lambda tmp: ["--api-key-file", str(tmp / "empty")], "holds no key"),
        (lambda tmp: ["--api-key", ""], "an API key cannot be empty"),
        (lambda tmp: ["--api-key", "two words"], "printable ASCII without spaces"),
    ],
)
def test_an_unusable_key_is_a_clear_error_not_a_traceback(tmp_path, make_args, message):
    (tmp_path / "empty").write_text("# no keys yet\n\n")
    result = run(*make_args(tmp_path), "--engine", "tcp://127.0.0.1:1")
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


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

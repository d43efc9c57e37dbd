"""Every usage or environment error of `trioserve` as a user meets it: the real command,
one line on stderr that names the cause and the fix, exit status 2 when the command line
is wrong and 1 when something it names cannot be used, and no traceback unless
``--log-level debug`` asks for one."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.waiting import HANG_GUARD

pytestmark = pytest.mark.integration

USAGE, ENVIRONMENT = 2, 1


def trioserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioserve", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that something listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.fixture(scope="module")
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, never listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: (arguments, exit status, what the one line must say); a callable builds the arguments
#: from (tmp_path, taken_port, closed_port).
Case = tuple[Callable[[Path, int, int], list[str]] | list[str], int, str]

CASES: dict[str, Case] = {
    # The command line is wrong: status 2, argparse's line and where the help is.
    "no command": ([], USAGE, "the following arguments are required: COMMAND"),
    "unknown option": (["run", "--frob"], USAGE, "unrecognized arguments: --frob"),
    "port not a number": (["run", "--port", "abc"], USAGE, "--port: expected a whole number"),
    "port out of range": (["run", "--port", "70000"], USAGE, "--port: expected a port, 0-65535"),
    "negative timeout": (["run", "--request-timeout", "-1"], USAGE, "must be zero or more"),
    "nan size": (["run", "--max-body-mb", "nan"], USAGE, "expected a finite number"),
    "unknown server": (["run", "--server", "nginx"], USAGE, "--server: invalid choice"),
    "log level": (["run", "--log-level", "loud"], USAGE, "--log-level: invalid choice"),
    "engine address without scheme": (
        ["run", "--engine", "10.0.0.5:5555"],
        USAGE,
        "expected tcp://HOST:PORT or ipc://PATH",
    ),
    "empty api key": (["run", "--api-key", ""], USAGE, "an API key cannot be empty"),
    "certificate without key": (
        ["run", "--ssl-certfile", "/nonexistent.pem"],
        USAGE,
        "--ssl-certfile and --ssl-keyfile go together: give both, or neither",
    ),
    "credentials with any origin": (
        ["run", "--cors-origin", "*", "--cors-allow-credentials"],
        USAGE,
        "needs explicit --cors-origin values",
    ),
    "client url port not a number": (
        ["client", "hi", "--url", "127.0.0.1:abc"],
        USAGE,
        "--url: expected http://HOST:PORT or https://HOST:PORT",
    ),
    "client url of another scheme": (
        ["client", "hi", "--url", "ftp://127.0.0.1:8000"],
        USAGE,
        "--url: expected http://HOST:PORT or https://HOST:PORT",
    ),
    "client sse over https": (
        ["client", "hi", "--sse", "--url", "https://127.0.0.1:8000"],
        USAGE,
        "--sse speaks plain http:// only",
    ),
    "client max tokens": (["client", "hi", "--max-tokens", "0"], USAGE, "must be positive"),
    "cors origin not an origin": (
        ["run", "--cors-origin", "not an origin"],
        USAGE,
        "--cors-origin: expected an origin, SCHEME://HOST[:PORT]",
    ),
    "cors origin with a path": (
        ["run", "--cors-origin", "https://app.example/"],
        USAGE,
        "--cors-origin: expected an origin",
    ),
    "mock model empty": (["run", "--mock-model", ""], USAGE, "--mock-model: expected a name"),
    "engine mock model empty": (
        ["engine", "mock", "--model", ""],
        USAGE,
        "--model: expected a name",
    ),
    "vllm args without vllm": (
        ["run", "--vllm-args", "--max-model-len 2048"],
        USAGE,
        "--vllm-args are options for the engine --vllm starts: give --vllm MODEL too",
    ),
    "vllm and an engine": (
        ["run", "--vllm", "org/model", "--engine", "tcp://127.0.0.1:9"],
        USAGE,
        "--vllm starts an engine of its own, --engine names engines running elsewhere",
    ),
    "vllm args unbalanced": (
        ["run", "--vllm", "org/model", "--vllm-args", "--chat-template 'x"],
        USAGE,
        "No closing quotation; give vLLM's options in one string",
    ),
    "vllm model directory missing": (
        lambda tmp, taken, closed: ["run", "--vllm", str(tmp / "no" / "model"), "--port", "0"],
        USAGE,
        "no such directory, and not a Hugging Face model name (NAME or ORG/NAME)",
    ),
    "engine grace period negative": (
        ["engine", "mock", "--grace-period", "-1"],
        USAGE,
        "--grace-period: must be zero or more",
    ),
    "engine rate not a number": (
        ["engine", "mock", "--tokens-per-second", "fast"],
        USAGE,
        "--tokens-per-second: expected a number",
    ),
    # Something the command line names cannot be used: status 1, one log line.
    "port in use": (
        lambda tmp, taken, closed: ["run", "--port", str(taken)],
        ENVIRONMENT,
        "Address already in use; another process listens there: stop it, or choose another --port",
    ),
    "host not of this machine": (
        ["run", "--host", "10.255.255.1", "--port", "0"],
        ENVIRONMENT,
        "10.255.255.1 is not an address of this machine: give --host one of its addresses",
    ),
    "host that does not resolve": (
        ["run", "--host", "nosuch.invalid"],
        ENVIRONMENT,
        "cannot listen on nosuch.invalid: ",
    ),
    "api key file missing": (
        lambda tmp, taken, closed: ["run", "--api-key-file", str(tmp / "keys")],
        ENVIRONMENT,
        "No such file or directory; --api-key-file takes a readable file of keys",
    ),
    "api key file without a key": (
        lambda tmp, taken, closed: ["run", "--api-key-file", str(tmp / "empty")],
        ENVIRONMENT,
        "holds no key",
    ),
    "certificate missing": (
        lambda tmp, taken, closed: [
            *("run", "--ssl-certfile", str(tmp / "cert.pem")),
            *("--ssl-keyfile", str(tmp / "key.pem")),
        ],
        ENVIRONMENT,
        "cert.pem: No such file or directory; give the path of a readable PEM file",
    ),
    "certificate not a certificate": (
        lambda tmp, taken, closed: [
            *("run", "--ssl-certfile", str(tmp / "empty")),
            *("--ssl-keyfile", str(tmp / "empty")),
        ],
        ENVIRONMENT,
        "TLS: the certificate, key or CA file cannot be used",
    ),
    "upload dir a file": (
        lambda tmp, taken, closed: ["run", "--upload-dir", str(tmp / "empty" / "uploads")],
        ENVIRONMENT,
        "uploads: Not a directory; give a directory this user may write to",
    ),
    "client and no server": (
        lambda tmp, taken, closed: ["client", "hi", "--url", f"127.0.0.1:{closed}"],
        ENVIRONMENT,
        "Connection refused; is the server running there? Start it (trioserve run)",
    ),
    "client and no server, sse": (
        lambda tmp, taken, closed: ["client", "hi", "--sse", "--url", f"127.0.0.1:{closed}"],
        ENVIRONMENT,
        "Connection refused; is the server running there?",
    ),
    "engine bind in use": (
        lambda tmp, taken, closed: ["engine", "mock", "--bind", f"tcp://127.0.0.1:{taken}"],
        ENVIRONMENT,
        "Address already in use; another process is bound there",
    ),
    "engine bind in use, asyncio": (
        lambda tmp, taken, closed: [
            *("engine", "mock", "--loop", "asyncio"),
            *("--bind", f"tcp://127.0.0.1:{taken}"),
        ],
        ENVIRONMENT,
        "Address already in use; another process is bound there",
    ),
    "engine ipc directory missing": (
        lambda tmp, taken, closed: ["engine", "mock", "--bind", f"ipc://{tmp}/no/engine.sock"],
        ENVIRONMENT,
        "the ipc:// path's directory does not exist: create it, or choose another path",
    ),
    "engine host not of this machine": (
        ["engine", "mock", "--bind", "tcp://10.255.255.1:5555"],
        ENVIRONMENT,
        "the host is not an address of this machine",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_an_error_is_one_line_with_its_status_and_no_traceback(
    case, tmp_path, taken_port, closed_port
):
    make_args, status, says = CASES[case]
    (tmp_path / "empty").write_text("# nothing yet\n")
    args = make_args(tmp_path, taken_port, closed_port) if callable(make_args) else make_args
    result = trioserve(*args)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert says in line
    if status == USAGE and line.startswith("trioserve"):  # argparse's: where the help is
        assert line.endswith(" --help)")
    assert result.stdout == ""


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vllm is installed in this Python"
)
@pytest.mark.parametrize(
    "args",
    [
        ["run", "--vllm", "some/model", "--port", "0"],
        ["engine", "vllm", "some/model", "--bind", "tcp://127.0.0.1:5555"],
    ],
)
def test_vllm_missing_is_one_line_before_anything_starts(args):
    result = trioserve(*args)
    assert result.returncode == ENVIRONMENT
    [line] = result.stderr.splitlines()
    assert "the vLLM engine needs vllm installed beside trioserve" in line
    assert "install it (docs/engines.md)" in line


@pytest.mark.parametrize("where", ["before", "after"])
def test_log_level_debug_adds_the_traceback_before_or_after_the_command(where, taken_port):
    level = ["--log-level", "debug"]
    command = ["run", "--port", str(taken_port)]
    args = [*level, *command] if where == "before" else [*command, *level]
    result = trioserve(*args)
    assert result.returncode == ENVIRONMENT
    assert "Traceback" in result.stderr and "OSError: [Errno 98]" in result.stderr
    assert result.stderr.splitlines()[-1].endswith(
        f"cannot listen on 127.0.0.1 port {taken_port}: Address already in use; another "
        "process listens there: stop it, or choose another --port"
    )


def test_version():
    from trioserve import __version__

    result = trioserve("--version")
    assert (result.returncode, result.stdout) == (0, f"trioserve {__version__}\n")

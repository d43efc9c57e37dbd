"""Every `curl` example of docs/api.md (and the README's) run verbatim, by the real curl in
a real shell, against `trioserve run` as it starts by default: each answers the status its
comment states (``# → 404 model_not_found``), with that error code.

The examples name the default address, 127.0.0.1:8000; the server here listens on a port
of its own (8000 may be taken on a shared machine), which is written into the commands.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from struct import pack

import pytest

from tests.helpers.waiting import HANG_GUARD
from trioserve.config import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
DOCUMENTS = [ROOT / "docs" / "api.md", ROOT / "README.md"]
DEFAULT_ADDRESS = "127.0.0.1:8000"
#: The comment above each example: the status, and the error code for an error.
EXPECTS = re.compile(r"^# → (\d{3})(?: (\w+))?$", re.MULTILINE)
#: A block's first line may say how its server is started (``# trioserve run OPTIONS``):
#: its examples run against a server started so; the others against plain `trioserve run`.
SERVER_LINE = re.compile(r"# trioserve run((?: [-\w]+)*)\n")


def examples() -> Iterator[tuple[str, str, int, str | None, str]]:
    """``(where, command, status, code, server options)`` of every annotated command in
    a ``sh`` block that runs curl."""
    for path in DOCUMENTS:
        text = path.read_text()
        for block in re.finditer(r"^```sh\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
            body = block.group(1)
            if not re.search(r"^curl ", body, re.MULTILINE):
                continue
            line = text.count("\n", 0, block.start(1)) + 1
            options = ""
            if started := SERVER_LINE.match(body):
                options, body, line = started.group(1).strip(), body[started.end() :], line + 1
            marks = list(EXPECTS.finditer(body))
            # Every curl command in the block is annotated, each by the comment above it.
            assert len(marks) == len(re.findall(r"^curl ", body, re.MULTILINE)), (path, line)
            assert marks and marks[0].start() == 0, (path, line)
            for mark, after in zip(marks, [*marks[1:], None], strict=True):
                command = body[mark.end() : after.start() if after else len(body)].strip()
                where = f"{path.name}:{line + body.count(chr(10), 0, mark.start())}"
                yield where, command, int(mark.group(1)), mark.group(2), options


EXAMPLES = list(examples())


def test_the_docs_have_examples_and_they_name_the_default_port():
    assert len(EXAMPLES) >= 10
    assert Settings().port == int(DEFAULT_ADDRESS.rsplit(":", 1)[1])
    for where, command, *_ in EXAMPLES:
        assert command.startswith("curl ") and DEFAULT_ADDRESS in command, where


def tiny_png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return pack(">I", len(data)) + kind + data + pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x80\x00" * 2 for _ in range(2))  # 2x2 RGB
    header = pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))


def start_server(log: Path, options: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "trioserve", "run", "--port", "0", *options.split()],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


def address_of(process: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + HANG_GUARD  # a ceiling against hangs, not a measure
    while not (running := re.search(rb"Running on http://(\S+) ", log.read_bytes())):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return running.group(1).decode()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], str]]:
    """`trioserve run` with a free port and the options a block names (started once for
    each set of options): the address, HOST:PORT, of the one for ``options``."""
    started: dict[str, tuple[subprocess.Popen[bytes], str]] = {}

    def server(options: str) -> str:
        if options not in started:
            log = tmp_path_factory.mktemp("server") / "stderr"
            process = start_server(log, options)
            started[options] = (process, "")
            started[options] = (process, address_of(process, log))
        return started[options][1]

    try:
        yield server
    finally:
        for process, _ in started.values():
            process.send_signal(signal.SIGINT)
        for process, _ in started.values():
            try:
                process.wait(HANG_GUARD)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Where the examples run: a directory with the `cat.png` one of them uploads, and a
    curl configuration (``CURL_HOME``) that prints the status after the body and bounds
    each request, so the commands stay as the doc spells them."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed here (.ci/run installs it)")
    home = tmp_path_factory.mktemp("shell")
    (home / "cat.png").write_bytes(tiny_png())
    (home / ".curlrc").write_text(f'write-out = "\\n%{{http_code}}\\n"\nmax-time = {HANG_GUARD}\n')
    return home, {**os.environ, "CURL_HOME": str(home)}


@pytest.mark.parametrize(
    ("command", "status", "code", "options"),
    [example[1:] for example in EXAMPLES],
    ids=[example[0] for example in EXAMPLES],
)
def test_the_example_answers_what_the_doc_says(servers, shell, command, status, code, options):
    cwd, env = shell
    command = command.replace(DEFAULT_ADDRESS, servers(options))
    result = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=HANG_GUARD * 2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    body, _, answered = result.stdout.rstrip("\n").rpartition("\n")
    assert int(answered) == status, body
    if code is not None:
        assert re.search(rf'"code": ?"{code}"', body), body

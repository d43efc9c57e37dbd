"""The frontends a ``tools.bench`` run measures: trioserve once per ``--trioserve-args``,
once per ``--baseline`` checkout, and the reference (``tools.reference_server``), each
started pinned and waited for; and the byte-for-byte check that they answer the same
requests with the same bytes."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from tools.toolkit import http_client
from tools.toolkit.processes import (
    FRONTEND_CORE,
    URL_RE,
    Proc,
    pin_prefix,
    spawn,
    tool_command,
    wait_for_log,
    wait_healthy,
)


@dataclass
class FrontendSpec:
    label: str
    command: list[str]  # without the engine address and port
    workers: int = 1  # trioserve's --workers: the capacity scenario's CPU cap is per worker


def trioserve_options() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "trioserve", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout


def frontend_specs(
    trioserve_args: list[str],
    most_requests: int,
    baselines: list[str] = (),
    reference: bool = True,
) -> list[FrontendSpec]:
    """trioserve once per ``--trioserve-args``, then once per ``--baseline`` checkout,
    then the reference (unless not wanted).

    trioserve's admission bound (``--max-concurrent-requests``, where it exists) is raised
    to what the plan opens at once, unless the arguments set it: the reference has none.
    """
    specs = []
    admission = "--max-concurrent-requests" in trioserve_options()
    workers_option = argparse.ArgumentParser(add_help=False)
    workers_option.add_argument("--workers", type=int, default=1)
    for extra in trioserve_args or [""]:
        label = "trioserve" + (f" {extra}" if extra else "")
        argv = shlex.split(extra)
        if admission and not any(a.startswith("--max-concurrent-requests") for a in argv):
            argv += ["--max-concurrent-requests", str(most_requests)]
        workers = workers_option.parse_known_args(argv)[0].workers
        specs.append(
            FrontendSpec(label, [sys.executable, "-m", "trioserve", "run", *argv], workers)
        )
    for checkout in baselines:
        # Another version of trioserve, from a checkout's src/ (a git worktree of an earlier
        # commit, say), against the same engine in the same run: before/after figures.
        src = Path(checkout).resolve() / "src"
        commit = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        argv = ["--max-concurrent-requests", str(most_requests)] if admission else []
        command = ["env", f"PYTHONPATH={src}", sys.executable, "-m", "trioserve", "run", *argv]
        specs.append(FrontendSpec(f"trioserve@{commit or checkout}", command))
    if reference:
        specs.append(FrontendSpec("reference", tool_command("reference_server")))
    return specs


def start_frontend(spec: FrontendSpec, engine: str, pin: bool, workdir: Path) -> Proc:
    command = [
        *pin_prefix(FRONTEND_CORE, pin),
        *spec.command,
        "--engine",
        engine,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    proc = spawn(spec.label, command, workdir)
    proc.url = wait_for_log(proc, URL_RE).group(1)
    wait_healthy(proc)
    return proc


# -- the byte-for-byte check ----------------------------------------------------------------

CHECKS = {
    "JSON": {"max_tokens": 5},
    "SSE + include_usage": {
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    "SSE": {"max_tokens": 3, "stream": True},
    "SSE, engine error after 2 tokens": {"max_tokens": 5, "stream": True, "mock_error_after": 2},
    "JSON, engine error 429": {"max_tokens": 5, "mock_error_after": 0, "mock_error_status": 429},
}


def fetch(url: str, body: dict, request_id: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"content-type: application/json\r\nx-request-id: {request_id}\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode()
    parts: list[bytes] = []
    response = http_client.Response()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + payload)
        while not response.done:
            data = sock.recv(65536)
            if not data:
                break
            response.feed(data, parts.append)
    return response.status, b"".join(parts)


def byte_check(frontends: list[Proc]) -> list[dict]:
    """Same request, same request id, to every frontend: are the bodies identical?"""
    results = []
    for i, (name, extra) in enumerate(CHECKS.items()):
        body = {"messages": [{"role": "user", "content": f"Check {i}: the same bytes?"}]}
        body.update(extra)
        request_id = f"bytecheck-{i}-{uuid.uuid4().hex[:8]}"
        answers = {}
        for proc in frontends:
            status, raw = fetch(proc.url, body, request_id)
            answers[proc.name] = (status, re.sub(rb'"created":\d+', b'"created":0', raw))
        first = next(iter(answers.values()))
        same = all(answer == first for answer in answers.values())
        entry = {"case": name, "identical": same, "bytes": len(first[1])}
        if not same:
            entry["answers"] = {
                k: [v[0], v[1][:2000].decode(errors="replace")] for k, v in answers.items()
            }
        results.append(entry)
    return results

"""CURVE from the command line: `trioserve keygen`, `trioserve engine mock --curve-*`,
`trioserve run --engine-curve-*`, as real processes on 127.0.0.1."""

from __future__ import annotations

import stat
import subprocess
import sys

import httpx
import pytest

from tests.helpers.processes import Proc, free_port, start_engine_process, start_frontend_process
from tests.helpers.waiting import HANG_GUARD
from trioserve.transport.keys import read_public_key, read_secret_key


def keygen(prefix) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trioserve", "keygen", str(prefix)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
    )


def test_keygen_writes_a_pair_with_a_private_secret_and_never_overwrites(tmp_path):
    done = keygen(tmp_path / "engine")
    assert done.returncode == 0, done.stderr
    public, secret = tmp_path / "engine.key", tmp_path / "engine.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert read_secret_key(secret)[0] == read_public_key(public)
    assert "secret-key" not in public.read_text()
    assert f"{public}: the public key" in done.stdout
    # pyzmq reads them as its own certificates.
    import zmq.auth

    z85_public, z85_secret = zmq.auth.load_certificate(secret)
    assert z85_secret is not None and zmq.curve_public(z85_secret) == z85_public
    before = secret.read_bytes()
    again = keygen(tmp_path / "engine")
    assert again.returncode == 2 and "exists: not overwritten" in again.stderr
    assert secret.read_bytes() == before


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
async def test_a_curve_engine_and_frontend_from_the_command_line_serve_a_request(
    nursery, tmp_path, loop
):
    for name in ("engine", "frontend"):
        assert keygen(tmp_path / name).returncode == 0
    port = free_port()
    engine = await start_engine_process(
        nursery,
        port,
        "--curve-secret-key",
        str(tmp_path / "engine.key_secret"),
        "--curve-authorized-keys",
        str(tmp_path / "frontend.key"),
        "--loop",
        loop,
    )
    assert b"CURVE, 1 frontend key(s) authorized" in engine.output
    frontend, url = await start_frontend_process(
        nursery,
        "--engine",
        f"tcp://127.0.0.1:{port}",
        "--engine-curve-server-key",
        str(tmp_path / "engine.key"),
        "--engine-curve-secret-key",
        str(tmp_path / "frontend.key_secret"),
    )
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        reply = await client.post("/v1/completions", json={"prompt": "over CURVE", "max_tokens": 3})
        assert reply.status_code == 200
    assert b"engine link: CURVE to 1 engine(s)" in frontend.output
    await frontend.stop()
    await engine.stop()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--engine-curve-secret-key", "{d}/frontend.key_secret"], "needs both keys"),
        (
            ["--engine-curve-server-key", "{d}/engine.key", "--engine-curve-secret-key", "{d}/x"],
            "No such file or directory",
        ),
        (
            ["--engine-curve-server-key", "{d}/engine.key"]
            + ["--engine-curve-secret-key", "{d}/frontend.key"],
            "a public certificate, with no secret key in it",
        ),
    ],
    ids=["one-key", "missing-file", "public-for-secret"],
)
async def test_run_refuses_curve_options_it_cannot_use_with_one_line(
    nursery, tmp_path, args, expected
):
    for name in ("engine", "frontend"):
        assert keygen(tmp_path / name).returncode == 0
    args = [arg.format(d=tmp_path) for arg in args]
    frontend = await Proc.start(
        nursery, "run", "--port", "0", "--engine", "tcp://127.0.0.1:9", *args
    )
    assert await frontend.wait() == 2
    assert expected in frontend.output.decode()
    assert b"Traceback" not in frontend.output


async def test_run_refuses_curve_keys_for_the_engine_it_starts_itself(nursery, tmp_path):
    assert keygen(tmp_path / "k").returncode == 0
    frontend = await Proc.start(
        nursery,
        "run",
        "--port",
        "0",
        "--engine-curve-server-key",
        str(tmp_path / "k.key"),
        "--engine-curve-secret-key",
        str(tmp_path / "k.key_secret"),
    )
    assert await frontend.wait() == 2
    assert b"are for --engine addresses" in frontend.output


async def test_an_engine_refuses_curve_without_authorized_keys(nursery, tmp_path):
    assert keygen(tmp_path / "engine").returncode == 0
    engine = await Proc.start(
        nursery,
        "engine",
        "mock",
        "--bind",
        f"tcp://127.0.0.1:{free_port()}",
        "--curve-secret-key",
        str(tmp_path / "engine.key_secret"),
    )
    assert await engine.wait() == 2
    assert b"--curve-secret-key and --curve-authorized-keys go together" in engine.output

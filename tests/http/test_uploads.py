"""Uploads: one safe path component, under --upload-dir only, removed however the request
ends; body limits and truncation while a multipart body streams in."""

from __future__ import annotations

import json
import re
import stat
import tempfile
from pathlib import Path

import pytest
import trio

from tests.helpers.frontends import capture_submits, start_engine, start_frontend
from tests.helpers.http import raw_request, read_until
from tests.helpers.waiting import wait_until
from trioserve.http.bodies import uploads
from trioserve.http.bodies.uploads import safe_filename

SAFE = re.compile(r"[0-9]+-[A-Za-z0-9._-]+")
HOSTILE = [
    "../../escaped.txt",
    "..\\..\\escaped.txt",
    "/etc/passwd",
    "....//....//escaped.txt",
    "..",
    ".",
    "",
    ".hidden",
    "a\x00b.png",
    "C:\\Windows\\win.ini",
    "%2e%2e%2fescaped.txt",
    "x" * 1000 + ".png",
    "name.<script>.p/n/g",
    "ünïcødé name.JPEG",
]


def upload_entries(root: Path) -> list[Path]:
    """Everything under the upload root (directories of requests still running)."""
    return sorted(root.rglob("*")) if root.exists() else []


def multipart(fields: dict[str, str], files: list[tuple[str, str, bytes, str]], boundary: str):
    """A multipart/form-data body built by hand (hostile filenames, truncation)."""
    out = b""
    for name, value in fields.items():
        out += (
            f'--{boundary}\r\ncontent-disposition: form-data; name="{name}"\r\n\r\n'.encode()
            + value.encode()
            + b"\r\n"
        )
    for field, filename, data, content_type in files:
        out += (
            (
                f'--{boundary}\r\ncontent-disposition: form-data; name="{field}"; '
                f'filename="{filename}"\r\ncontent-type: {content_type}\r\n\r\n'
            ).encode()
            + data
            + b"\r\n"
        )
    return out + f"--{boundary}--\r\n".encode()


@pytest.fixture
async def setup(nursery, tmp_path, http_server):
    engine = await start_engine(nursery)
    root = tmp_path / "uploads"
    frontend = await start_frontend(
        nursery,
        engine,
        server=http_server,
        upload_dir=str(root),
        max_body_bytes=64 * 1024,
        body_timeout=0.5,
    )
    return frontend, root


@pytest.mark.parametrize("name", HOSTILE)
def test_safe_filename_is_one_safe_component(name):
    safe = safe_filename(name, "image/png", 3)
    assert SAFE.fullmatch(safe), safe
    assert safe.startswith("3-") and "/" not in safe and len(safe) <= 100


def test_safe_filename_keeps_a_clean_extension_or_guesses_one():
    assert safe_filename("photo.JPEG", None, 0) == "0-photo.jpeg"
    assert safe_filename("archive.tar.gz", None, 1) == "1-archive.tar.gz"
    assert safe_filename("noext", "image/png", 2) == "2-noext.png"
    assert safe_filename("evil.p$h%p", None, 0) == "0-evil.php"
    assert safe_filename("x." + "a" * 50, None, 0) == "0-x." + "a" * 10


async def test_hostile_filenames_write_only_under_the_upload_dir_and_are_removed(setup, tmp_path):
    frontend, root = setup
    # Things a traversal would hit: they must be neither written nor deleted.
    sentinel = tmp_path / "escaped.txt"
    sentinel.write_text("keep me")
    before = sorted(p for p in tmp_path.rglob("*") if root not in p.parents and p != root)
    submits = capture_submits(frontend)
    seen_during_request = []
    original = frontend.engine.core.handle

    def spy(identity, frame, now):
        actions = original(identity, frame, now)
        if submits and not seen_during_request:
            seen_during_request.extend(upload_entries(root))
        return actions

    frontend.engine.core.handle = spy
    boundary = "b0undary"
    files = [("file", name, f"data {i}".encode(), "image/png") for i, name in enumerate(HOSTILE)]
    body = multipart({"prompt": "x", "max_tokens": "1"}, files, boundary)
    async with frontend.client() as client:
        response = await client.post(
            "/generate",
            content=body,
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )
    assert response.status_code == 200, response.text
    [submit] = submits
    media = submit.inputs["media"]
    assert len(media) == len(HOSTILE)
    for i, record in enumerate(media):
        path = Path(record["path"])
        assert path.parent.parent == root and path.parent.name.startswith("req-")
        assert SAFE.fullmatch(path.name) and path.name == record["filename"]
        assert Path(record["path"]) in seen_during_request  # it existed while the engine ran
        assert record["modality"] == "image" and record["mime_type"] == "image/png"
        assert path.name.startswith(f"{i}-")
    after = sorted(p for p in tmp_path.rglob("*") if root not in p.parents and p != root)
    assert after == before and sentinel.read_text() == "keep me"
    # Removed when the request ended (just after the response).
    await wait_until(lambda: upload_entries(root) == [], "the uploads to be removed")


async def test_uploads_are_removed_when_the_engine_fails(setup):
    frontend, root = setup
    async with frontend.client() as client:
        response = await client.post(
            "/generate",
            data={"prompt": "x", "mock_error_after": "0"},  # a string knob: the mock fails
            files={"image": ("a.png", b"png", "image/png")},
        )
    assert response.status_code == 400  # the mock refuses a string knob: an engine error
    assert response.json()["code"] == "engine_error"
    await wait_until(lambda: upload_entries(root) == [], "the uploads to be removed")


async def test_uploads_are_removed_when_the_client_disconnects_mid_generation(setup):
    frontend, root = setup
    boundary = "xyz"
    body = multipart(
        {"prompt": "x", "max_tokens": "100000"}, [("f", "a.png", b"abc", "image/png")], boundary
    )
    stream = await raw_request(
        frontend,
        "POST",
        "/generate",
        body,
        x_request_id="up-1",
        content_type=f"multipart/form-data; boundary={boundary}",
    )
    key = (frontend.frontend_id, "up-1")
    await wait_until(lambda: key in frontend.engine.core.running, "the request to run")
    assert len(upload_entries(root)) == 2  # the request's directory and its file
    await stream.aclose()
    await wait_until(lambda: frontend.ends("up-1") == ["aborted"], "the abort")
    await wait_until(lambda: upload_entries(root) == [], "the upload to be removed")


async def test_multipart_over_the_limit_is_413_mid_upload_without_submission(setup):
    frontend, root = setup
    submits = capture_submits(frontend)
    boundary = "big"
    head = multipart({"prompt": "x"}, [], boundary).removesuffix(f"--{boundary}--\r\n".encode())
    head += (
        f'--{boundary}\r\ncontent-disposition: form-data; name="f"; filename="big.bin"\r\n'
        "content-type: application/octet-stream\r\n\r\n"
    ).encode()
    # Chunked, no Content-Length: the limit must be found while the upload streams.
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    await stream.send_all(
        b"POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
        + f"content-type: multipart/form-data; boundary={boundary}\r\n\r\n".encode()
    )
    await stream.send_all(b"%x\r\n%s\r\n" % (len(head), head))
    chunk = b"z" * 16384
    response = b""
    with trio.move_on_after(20):
        for _ in range(8):  # 128 KiB in all, twice the limit
            await stream.send_all(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        response = await read_until(stream, b"}")
    await stream.aclose()
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    assert b"body_too_large" in response
    assert submits == []
    await wait_until(lambda: upload_entries(root) == [], "the partial upload to be removed")


async def test_mid_upload_disconnect_submits_nothing_and_leaves_nothing(setup):
    frontend, root = setup
    submits = capture_submits(frontend)
    boundary = "cut"
    body = multipart({"prompt": "x"}, [("f", "a.bin", b"q" * 20000, "video/mp4")], boundary)
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    await stream.send_all(
        b"POST /generate HTTP/1.1\r\nhost: x\r\n"
        + f"content-type: multipart/form-data; boundary={boundary}\r\n".encode()
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body[: len(body) // 2]
    )
    await wait_until(lambda: len(upload_entries(root)) == 2, "the upload to start")
    await stream.aclose()
    await wait_until(lambda: upload_entries(root) == [], "the partial upload to be removed")
    assert submits == []


async def test_a_body_that_stops_arriving_is_408_without_submission(setup):
    frontend, root = setup
    submits = capture_submits(frontend)
    boundary = "slow"
    body = multipart({"prompt": "x"}, [("f", "a.bin", b"q" * 1000, "image/png")], boundary)
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    await stream.send_all(
        b"POST /generate HTTP/1.1\r\nhost: x\r\n"
        + f"content-type: multipart/form-data; boundary={boundary}\r\n".encode()
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body[:-50]
    )
    response = await read_until(stream, b"}")  # body_timeout is 0.5 s
    await stream.aclose()
    assert response.startswith(b"HTTP/1.1 408"), response[:200]
    assert b"body_timeout" in response
    assert submits == []
    await wait_until(lambda: upload_entries(root) == [], "the partial upload to be removed")


async def test_a_truncated_multipart_body_is_400(setup):
    frontend, root = setup
    body = multipart({"prompt": "x"}, [("f", "a.png", b"abc", "image/png")], "trunc")
    cut = body[: body.rindex(b"--trunc--")]
    async with frontend.client() as client:
        response = await client.post(
            "/generate",
            content=cut,
            headers={"content-type": "multipart/form-data; boundary=trunc"},
        )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_form"
    await wait_until(lambda: upload_entries(root) == [], "the uploads to be removed")


async def test_multipart_without_boundary_is_400(setup):
    frontend, _ = setup
    async with frontend.client() as client:
        response = await client.post(
            "/generate", content=b"x", headers={"content-type": "multipart/form-data"}
        )
    assert response.status_code == 400 and "boundary" in response.json()["detail"]


async def test_json_over_the_limit_is_413_declared_or_chunked(setup):
    frontend, _ = setup
    big = json.dumps({"prompt": "x" * 70_000}).encode()
    async with frontend.client() as client:
        declared = await client.post(
            "/generate", content=big, headers={"content-type": "application/json"}
        )

        async def chunks():
            for i in range(0, len(big), 8192):
                yield big[i : i + 8192]

        chunked = await client.post(
            "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"}
        )
    assert declared.status_code == 413 and declared.json()["code"] == "body_too_large"
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "body_too_large"
    # Said as the operator sets it, so the fix is at hand.
    assert chunked.json()["error"]["message"] == (
        "the body exceeds the server's limit of 0.0625 MiB (65536 bytes; trioserve run "
        "--max-body-mb)"
    )


def test_the_default_upload_root_is_private_to_the_process_and_made_fresh(tmp_path, monkeypatch):
    # A shared, predictable path someone else could have made first (or linked elsewhere)
    # is never used: the root is created anew, mode 0700, once per process.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "trioserve-uploads").symlink_to("/etc")
    uploads.default_upload_root.cache_clear()
    try:
        root = uploads.default_upload_root()
        assert root.parent == tmp_path and not root.is_symlink()
        assert root != tmp_path / "trioserve-uploads"
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        assert uploads.default_upload_root() == root  # one per process
    finally:
        uploads.default_upload_root.cache_clear()

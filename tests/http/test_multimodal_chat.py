"""Chat content parts with media: lenient data URIs, remote media only when allowed (with a
size cap and a timeout), modalities in first-seen order."""

from __future__ import annotations

import base64
import socket
from functools import partial

import openai
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from tests.helpers.frontends import capture_submits, start_engine, start_frontend
from trioserve.engine_programs.mock import expected_text

IMAGE = b"\x89PNG\r\n\x1a\n-an-image-"
AUDIO = b"RIFF-some-audio"
VIDEO = b"\x00\x00\x00\x18ftypisom-video"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def chat(*parts, max_tokens: int = 2) -> dict:
    return {"messages": [{"role": "user", "content": list(parts)}], "max_tokens": max_tokens}


async def media_server(nursery: trio.Nursery) -> str:
    """A local HTTP server with the media the tests fetch."""

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        path = scope["path"]
        if path == "/slow":
            await trio.sleep_forever()
        redirects = {
            "/redirect": b"/cat.png",
            # Loopback, but not the allowed 127.0.0.1: refused on the redirect too.
            "/to-loopback": b"http://127.0.0.2/cat.png",
            "/to-metadata": b"http://169.254.169.254/latest/meta-data/",
            "/loop": b"/loop",
        }
        if path in redirects:
            await send({"type": "http.response.start", "status": 302,
                        "headers": [(b"location", redirects[path])]})  # fmt: skip
            await send({"type": "http.response.body", "body": b""})
            return
        body = {"/cat.png": IMAGE, "/big.png": b"x" * 5000}.get(path)
        status = 200 if body is not None else 404
        headers = [(b"content-type", b"image/png")] if body else []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body or b"not found"})

    config = Config()
    config.bind = ["127.0.0.1:0"]
    binds = await nursery.start(partial(serve, app, config))
    return binds[0]


@pytest.fixture
async def remote(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery,
        engine,
        server=http_server,
        allow_remote_media=True,
        remote_media_max_bytes=1000,
        # Only /slow (which never answers) must hit it; the others must answer well
        # within it, even on a loaded machine (0.3 s was not always enough for a 404).
        remote_media_timeout=5.0,
        # The media server is on loopback, refused unless allowed.
        remote_media_allow=["127.0.0.1/32"],
    )
    return frontend, await media_server(nursery)


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:{port}/cat.png",  # resolves to loopback
        "http://127.0.0.2:{port}/cat.png",
        "http://[::1]:{port}/cat.png",
        "http://[::ffff:127.0.0.1]:{port}/cat.png",
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata (link-local)
        "http://10.0.0.1/x.png",
        "http://192.168.1.1/x.png",
        "http://100.64.0.1/x.png",  # shared address space (CGNAT)
        "http://224.0.0.1/x.png",
        "http://0.0.0.0:{port}/cat.png",
    ],
)
async def test_remote_media_from_addresses_that_are_not_public_is_refused(
    nursery, http_server, url
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, allow_remote_media=True, remote_media_timeout=5.0
    )
    server = await media_server(nursery)
    port = server.rpartition(":")[2]
    submits = capture_submits(frontend)
    part = {"type": "image_url", "image_url": {"url": url.format(port=port)}}
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(part))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "media_fetch_failed"
    assert port not in error["message"] and "refused" not in error["message"].lower()
    assert submits == []


@pytest.mark.parametrize("path", ["/to-loopback", "/to-metadata", "/loop", "/missing"])
async def test_every_failed_fetch_answers_alike_redirects_checked_like_the_first_url(remote, path):
    frontend, server = remote
    submits = capture_submits(frontend)
    part = {"type": "image_url", "image_url": {"url": f"{server}{path}"}}
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(part))
    assert response.status_code == 400
    error = response.json()["error"]
    # The same words whatever failed: neither a status, nor an error's name, nor a port.
    assert error == {
        "message": "$.messages[0].content[0].image_url.url: the media URL could not be fetched",
        "type": "invalid_request_error",
        "param": "messages[0].content[0].image_url.url",
        "code": "media_fetch_failed",
    }
    assert submits == []


async def test_a_closed_port_and_a_missing_path_answer_alike(remote):
    frontend, server = remote
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    answers = []
    async with frontend.client() as client:
        for url in (f"http://127.0.0.1:{closed}/x.png", f"{server}/missing"):
            part = {"type": "image_url", "image_url": {"url": url}}
            response = await client.post("/v1/chat/completions", json=chat(part))
            answers.append((response.status_code, response.json()["error"]["message"]))
    assert answers[0] == answers[1]


async def test_media_parts_reach_the_engine_decoded_with_modalities_in_first_seen_order(
    frontend,
):
    submits = capture_submits(frontend)
    spaced = b64(IMAGE)
    spaced = " ".join(spaced[i : i + 4] for i in range(0, len(spaced), 4)).rstrip("=")
    body = chat(
        {"type": "input_audio", "input_audio": {"data": b64(AUDIO), "format": "wav"}},
        {"type": "text", "text": "describe"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,\n{spaced}\n"}},
        {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{b64(VIDEO)}"}},
        {"type": "image_url", "image_url": f"data:image/jpeg;base64,{b64(b'jpeg')}"},
    )
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == expected_text("describe", 2)
    inputs = submits[0].inputs
    assert inputs["modalities"] == ["audio", "text", "image", "video"]
    parts = inputs["messages"][0]["content"]
    assert parts[0] == {
        "type": "audio",
        "media": {"modality": "audio", "mime_type": "audio/wav", "data": AUDIO},
    }
    assert parts[1] == {"type": "text", "text": "describe"}
    assert parts[2]["media"] == {"modality": "image", "mime_type": "image/png", "data": IMAGE}
    assert parts[3]["media"]["data"] == VIDEO and parts[3]["type"] == "video"
    assert parts[4]["media"]["mime_type"] == "image/jpeg"


async def test_plain_text_chat_says_text_only(frontend):
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
    assert submits[0].inputs["modalities"] == ["text"]


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.mark.parametrize(
    ("part", "status", "code"),
    [
        (image_part("data:image/png;base64,@@@"), 400, "invalid_media"),
        (image_part("data:image/png;base64"), 400, "invalid_media"),
        ({"type": "image_url", "image_url": {}}, 422, "invalid_request"),
        ({"type": "input_audio", "input_audio": {"format": "wav"}}, 422, "invalid_request"),
        (image_part("file:///etc/passwd"), 400, "invalid_media_url"),
        (image_part("http://127.0.0.1:9/x.png"), 400, "remote_media_disabled"),
    ],
)
async def test_bad_media_is_refused_before_any_submission(frontend, part, status, code):
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(part))
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert submits == []


async def test_remote_media_is_fetched_when_allowed(remote):
    frontend, server = remote
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        for path in ("/cat.png", "/redirect"):
            part = {"type": "image_url", "image_url": {"url": f"{server}{path}"}}
            response = await client.post("/v1/chat/completions", json=chat(part))
            assert response.status_code == 200, response.text
    for submit in submits:
        media = submit.inputs["messages"][0]["content"][0]["media"]
        assert media == {"modality": "image", "mime_type": "image/png", "data": IMAGE}


@pytest.mark.parametrize(
    ("path", "code"),
    [("/big.png", "media_too_large"), ("/slow", "media_fetch_timeout"),
     ("/missing", "media_fetch_failed")],
)  # fmt: skip
async def test_remote_media_has_a_size_cap_and_a_timeout(remote, path, code):
    frontend, server = remote
    submits = capture_submits(frontend)
    part = {"type": "image_url", "image_url": {"url": f"{server}{path}"}}
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(part))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert submits == []


async def test_the_size_cap_counts_every_url_of_the_request(remote):
    frontend, server = remote  # the cap is 1000 bytes; each image is a few dozen
    part = {"type": "image_url", "image_url": {"url": f"{server}/cat.png"}}
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(*[part] * 60))
    assert response.json()["error"]["code"] == "media_too_large"


async def test_official_client_sends_image_parts(frontend):
    submits = capture_submits(frontend)
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="x", max_retries=0)
    async with client:
        answer = await client.chat.completions.create(
            model="mock",
            max_tokens=2,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is it"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{b64(IMAGE)}"},
                        },
                    ],
                }
            ],
        )
    assert answer.choices[0].message.content == expected_text("what is it", 2)
    assert submits[0].inputs["modalities"] == ["text", "image"]

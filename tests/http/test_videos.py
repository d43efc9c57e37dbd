"""``POST /v1/videos/generations``: text or image/video conditioning, never both."""

from __future__ import annotations

import base64

import pytest

from tests.helpers.frontends import capture_submits, start_engine, start_frontend
from tests.helpers.waiting import wait_until
from trioserve.engine_programs.mock import mock_video
from trioserve.http.writers import stream as writers

FRAME = b"\x89PNG-first-frame"


def video_of(response) -> bytes:
    [item] = response.json()["data"]
    assert item["mime_type"] == "video/mp4"
    return base64.b64decode(item["b64_json"])


async def test_text_to_video_with_first_class_and_passed_through_knobs(frontend):
    submits = capture_submits(frontend)
    body = {"prompt": "waves", "num_frames": "3", "fps": 12, "seed": 1, "guidance_scale": 4.5}
    async with frontend.client() as client:
        response = await client.post("/v1/videos/generations", json=body)
    assert response.status_code == 200, response.text
    video = video_of(response)
    assert video == mock_video("waves", 1, 3, 12.0)
    assert video[4:8] == b"ftyp"
    params = submits[0].params
    assert params["num_frames"] == 3 and params["fps"] == 12.0
    assert params["guidance_scale"] == 4.5
    assert submits[0].task == "video_generation"


async def test_image_conditioning_as_a_data_uri(frontend):
    uri = "data:image/png;base64," + base64.b64encode(FRAME).decode()
    async with frontend.client() as client:
        response = await client.post(
            "/v1/videos/generations", json={"prompt": "p", "num_frames": 2, "image": {"url": uri}}
        )
    assert video_of(response) == mock_video("p", None, 2, 8.0, FRAME)


async def test_video_conditioning_as_an_upload(frontend):
    clip = b"\x00\x00\x00\x18ftypisom-source"
    async with frontend.client() as client:
        response = await client.post(
            "/v1/videos/generations",
            data={"prompt": "p", "num_frames": "2", "fps": "24"},
            files={"video": ("clip.mp4", clip, "video/mp4")},
        )
    assert video_of(response) == mock_video("p", None, 2, 24.0, clip)


async def test_image_and_video_conditioning_at_once_is_400(frontend):
    submits = capture_submits(frontend)
    uri = "data:image/png;base64," + base64.b64encode(FRAME).decode()
    async with frontend.client() as client:
        as_json = await client.post(
            "/v1/videos/generations",
            json={"prompt": "p", "image": uri, "video": "data:video/mp4;base64,AAAA"},
        )
        as_form = await client.post(
            "/v1/videos/generations",
            data={"prompt": "p"},
            files={"image": ("a.png", FRAME, "image/png"), "video": ("v.mp4", b"v", "video/mp4")},
        )
    for response in (as_json, as_form):
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "conflicting_conditioning"
    assert submits == []


@pytest.mark.parametrize(
    ("body", "loc"),
    [({"prompt": "p", "num_frames": 0}, "$.num_frames"), ({"prompt": "p", "fps": -1}, "$.fps"),
     ({"num_frames": 2}, "$.prompt")],
)  # fmt: skip
async def test_invalid_video_requests_are_422(frontend, body, loc):
    async with frontend.client() as client:
        response = await client.post("/v1/videos/generations", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["loc"] == loc


async def test_an_answer_too_large_to_collect_is_502_and_aborted_once(frontend, monkeypatch):
    monkeypatch.setattr(writers, "MAX_COLLECTED_BYTES", 200)
    async with frontend.client() as client:
        response = await client.post(
            "/v1/videos/generations",
            json={"prompt": "p", "num_frames": 1000, "mock_tokens_per_second": 50},
            headers={"x-request-id": "big"},
        )
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "response_too_large"
    await wait_until(lambda: frontend.ends("big"), "the end")
    assert frontend.ends("big") == ["aborted"]


@pytest.mark.parametrize(
    ("path", "name"),
    [("/v1/audio/speech", "speech synthesis"), ("/v1/images/generations", "image generation"),
     ("/v1/images/edits", "image editing"), ("/v1/videos/generations", "video generation")],
)  # fmt: skip
async def test_routes_the_engines_do_not_support_are_404(nursery, path, name, http_server):
    engine = await start_engine(nursery, capabilities=["chat", "completion"])
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with frontend.client() as client:
        response = await client.post(path, json={"prompt": "x", "input": "x"})
        chat = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "route_not_supported" and name in error["message"]
    assert chat.status_code == 200

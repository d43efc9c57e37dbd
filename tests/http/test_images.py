"""Images: ``n`` submissions with seeds ``seed + i``, each ending exactly once; edits with
an uploaded image."""

from __future__ import annotations

import base64
import json

import openai
import pytest
import trio

from tests.helpers.frontends import capture_submits
from tests.helpers.http import raw_request
from tests.helpers.media import png_info
from tests.helpers.waiting import wait_until
from trioserve.engine_programs.mock import mock_image


def images_of(response) -> list[bytes]:
    return [base64.b64decode(d["b64_json"]) for d in response.json()["data"]]


async def test_n_images_are_n_submissions_with_consecutive_seeds(frontend):
    submits = capture_submits(frontend)
    body = {"prompt": "a red fox", "n": 3, "seed": 7, "size": "8x4", "style": "vivid", "steps": 9}
    async with frontend.client() as client:
        many = await client.post(
            "/v1/images/generations", json=body, headers={"x-request-id": "im"}
        )
        one = await client.post("/v1/images/generations", json={**body, "n": 1})
    assert many.status_code == 200, many.text
    images = images_of(many)
    assert images == [mock_image("a red fox", 7 + i, "8x4") for i in range(3)]
    assert images[0] == images_of(one)[0]  # image 0 is what n=1 gets
    for image in images:
        assert png_info(image)[:2] == (8, 4)
    assert sorted(s.params["seed"] for s in submits[:3]) == [7, 8, 9]
    assert all(s.params["steps"] == 9 and s.params["style"] == "vivid" for s in submits)
    assert [frontend.ends(f"im.{i}") for i in range(3)] == [["finished"]] * 3
    assert frontend.engine.stats.aborts_received == 0


async def test_without_a_seed_n_images_still_get_distinct_consecutive_seeds(frontend):
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        response = await client.post("/v1/images/generations", json={"prompt": "x", "n": 2})
        single = await client.post("/v1/images/generations", json={"prompt": "x"})
    assert response.status_code == single.status_code == 200
    first, second = sorted(s.params["seed"] for s in submits[:2])
    assert second == first + 1
    assert "seed" not in submits[2].params


async def test_one_failed_image_ends_the_others_exactly_once(frontend):
    # Seed 11 fails at once; 10 and 12 would never finish: they must be aborted.
    body = {
        "prompt": "x",
        "n": 3,
        "seed": 10,
        "mock_hang_after": 0,
        "mock_by_seed": {"11": {"mock_hang_after": None, "mock_error_after": 0,
                                "mock_error_status": 502, "mock_error_message": "gpu on fire"}},
    }  # fmt: skip
    async with frontend.client() as client:
        response = await client.post(
            "/v1/images/generations", json=body, headers={"x-request-id": "fail"}
        )
    assert response.status_code == 502
    assert response.json()["error"]["message"] == "gpu on fire"
    await wait_until(lambda: all(frontend.ends(f"fail.{i}") for i in range(3)), "every end")
    assert [frontend.ends(f"fail.{i}") for i in range(3)] == [
        ["aborted"],
        ["finished"],
        ["aborted"],
    ]
    assert frontend.engine.stats.unknown_aborts == 0
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "the registry to empty")


async def test_a_client_that_hangs_up_aborts_every_image_once(frontend):
    body = json.dumps({"prompt": "x", "n": 4, "mock_hang_after": 0}).encode()
    stream = await raw_request(
        frontend, "POST", "/v1/images/generations", body, x_request_id="gone"
    )
    keys = [(frontend.frontend_id, f"gone.{i}") for i in range(4)]
    await wait_until(lambda: all(k in frontend.engine.core.running for k in keys), "4 running")
    await stream.aclose()
    await wait_until(lambda: all(frontend.ends(f"gone.{i}") for i in range(4)), "every end")
    assert [frontend.ends(f"gone.{i}") for i in range(4)] == [["aborted"]] * 4
    assert frontend.engine.stats.unknown_aborts == 0
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "the registry to empty")


async def test_cancelling_the_request_id_cancels_every_image(frontend):
    result = {}

    async def call():
        async with frontend.client() as client:
            result["r"] = await client.post(
                "/v1/images/generations",
                json={"prompt": "x", "n": 2, "mock_hang_after": 0},
                headers={"x-request-id": "cx"},
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        keys = [(frontend.frontend_id, f"cx.{i}") for i in range(2)]
        await wait_until(lambda: all(k in frontend.engine.core.running for k in keys), "running")
        async with frontend.client() as client:
            assert (await client.delete("/v1/requests/cx")).status_code == 200
    assert result["r"].status_code == 499
    await wait_until(lambda: all(frontend.ends(f"cx.{i}") for i in range(2)), "every end")
    assert [frontend.ends(f"cx.{i}") for i in range(2)] == [["aborted"]] * 2


async def test_deadline_ends_every_image_once(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/images/generations",
            json={"prompt": "x", "n": 2, "mock_hang_after": 0},
            headers={"x-request-id": "dl", "x-request-timeout": "0.2"},
        )
    assert response.status_code == 504
    await wait_until(lambda: all(frontend.ends(f"dl.{i}") for i in range(2)), "every end")
    assert [frontend.ends(f"dl.{i}") for i in range(2)] == [["aborted"]] * 2


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"prompt": "x", "response_format": "url"}, 400, "unsupported_response_format"),
        ({"prompt": "x", "n": 11}, 422, "invalid_request"),
        ({"prompt": "x", "n": 0}, 422, "invalid_request"),
        ({"n": 1}, 422, "invalid_request"),
    ],
)
async def test_bad_image_requests(frontend, body, status, code):
    async with frontend.client() as client:
        response = await client.post("/v1/images/generations", json=body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


async def test_edits_take_the_uploaded_image(frontend, tmp_path):
    source = b"\x89PNG-the-image-to-edit"
    async with frontend.client() as client:
        response = await client.post(
            "/v1/images/edits",
            data={"prompt": "add a hat", "n": "2", "seed": "3"},
            files={"image": ("../cat.png", source, "image/png")},
        )
    assert response.status_code == 200, response.text
    assert images_of(response) == [mock_image("add a hat", 3 + i, None, source) for i in range(2)]


async def test_edits_need_an_image_and_multipart(frontend):
    async with frontend.client() as client:
        no_image = await client.post("/v1/images/edits", data={"prompt": "x"}, files={})
        as_json = await client.post("/v1/images/edits", json={"prompt": "x"})
    assert no_image.status_code == 400
    assert as_json.status_code == 400
    assert "multipart/form-data" in as_json.json()["error"]["message"]


async def test_official_client_generate_and_edit(frontend):
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="x", max_retries=0)
    async with client:
        generated = await client.images.generate(
            model="mock", prompt="a fox", n=2, response_format="b64_json"
        )
        edited = await client.images.edit(
            model="mock", image=("cat.png", b"\x89PNG-cat", "image/png"), prompt="hat"
        )
    assert len(generated.data) == 2
    for item in [*generated.data, *edited.data]:
        png_info(base64.b64decode(item.b64_json))

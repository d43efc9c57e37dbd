"""``/tokenize``, ``/detokenize`` and the render routes, over the mock engine with
``--tokenizer`` (the harder tiny Llama's text assets), on both HTTP servers."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.helpers.frontends import start_frontend
from tests.helpers.text_models import build_text_model
from trioserve.text.assets import ModelText
from trioserve.text.prompts import chat_prompt
from trioserve.text.template import ChatOptions

MESSAGES = [
    {"role": "system", "content": "Réponds brièvement."},
    {"role": "user", "content": [{"type": "text", "text": "Wetter in Zürich? 日本 🙂"}]},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_text_model(tmp_path_factory.mktemp("harder"), harder=True)


@pytest.fixture
async def texted(nursery: trio.Nursery, engine, http_server: str, model_dir: Path):
    return await start_frontend(nursery, engine, server=http_server, tokenizer=str(model_dir))


async def test_tokenize_prompt_and_messages(texted, model_dir):
    model = ModelText.load(model_dir)
    async with texted.client() as client:
        prompt = await client.post(
            "/tokenize", json={"prompt": "Grüße 漢字", "return_token_strs": True}
        )
        chat = await client.post("/tokenize", json={"messages": MESSAGES})
    assert prompt.status_code == 200
    body = prompt.json()
    assert body["tokens"] == model.encode("Grüße 漢字", add_special_tokens=True)
    assert body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 8192
    assert body["token_strs"] == [model.tokenizer.id_to_token(i) for i in body["tokens"]]
    expected = chat_prompt(model, MESSAGES, ChatOptions())
    assert chat.json()["tokens"] == expected.token_ids
    assert chat.json()["token_strs"] is None


async def test_detokenize_round_trips(texted, model_dir):
    model = ModelText.load(model_dir)
    ids = model.encode("Zürich 👩‍💻 日本語", add_special_tokens=False)
    async with texted.client() as client:
        answer = await client.post("/detokenize", json={"tokens": ids})
        bad = await client.post("/detokenize", json={"tokens": [10**6]})
        wrong = await client.post("/detokenize", json={"tokens": "abc"})
    assert answer.json() == {"prompt": "Zürich 👩‍💻 日本語"}
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    assert wrong.status_code == 422


async def test_render_chat_gives_token_ids_and_lowered_sampling(texted, model_dir):
    model = ModelText.load(model_dir)
    async with texted.client() as client:
        answer = await client.post(
            "/v1/chat/completions/render",
            json={"messages": MESSAGES, "stop": ["\n"], "seed": 3, "max_tokens": 10},
        )
    assert answer.status_code == 200
    body = answer.json()
    assert body["token_ids"] == chat_prompt(model, MESSAGES, ChatOptions()).token_ids
    params = body["sampling_params"]
    # the model's generation_config defaults, under the request's own
    assert (params["temperature"], params["top_k"], params["max_tokens"]) == (0.7, 40, 10)
    assert params["stop"] == ["\n"] and params["seed"] == 3
    assert not any(key.startswith("_") for key in params)


async def test_render_completion_is_a_list_and_takes_token_ids(texted):
    async with texted.client() as client:
        text = await client.post("/v1/completions/render", json={"prompt": "Once upon"})
        ids = await client.post("/v1/completions/render", json={"prompt": [5, 6, 7]})
    assert text.status_code == 200 and isinstance(text.json(), list)
    assert text.json()[0]["sampling_params"]["max_tokens"] == 16
    assert ids.json()[0]["token_ids"] == [5, 6, 7]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions/render", {"messages": MESSAGES, "n": 2, "temperature": 0}, "n"),
        ("/v1/chat/completions/render", {"messages": MESSAGES, "min_p": 7}, "min_p"),
        ("/v1/chat/completions/render", {"messages": MESSAGES, "max_tokens": 10**5}, "max_tokens"),
        (
            "/v1/chat/completions/render",
            {"messages": MESSAGES, "chat_template": "x"},
            "chat_template",
        ),
        (
            "/v1/chat/completions/render",
            {
                "messages": [
                    {
                        "role": "developer",
                        "content": [{"type": "image_url", "image_url": {"url": "data:,"}}],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
        (
            "/tokenize",
            {"messages": [{"role": "tool", "content": "x"}, {"role": "function", "content": "y"}]},
            None,
        ),
        ("/v1/completions/render", {"prompt": "x", "top_p": 0}, "top_p"),
    ],
)
async def test_what_vllm_refuses_is_a_400_and_the_server_goes_on(texted, path, body, param):
    async with texted.client() as client:
        refused = await client.post(path, json=body)
        after = await client.post("/tokenize", json={"prompt": "still here"})
    assert refused.status_code in (400, 422), refused.text
    if refused.status_code == 400 and param is not None:
        assert refused.json()["error"]["param"] == param
    assert after.status_code == 200


async def test_without_a_tokenizer_the_routes_say_so(frontend):
    async with frontend.client() as client:
        for path, body in [
            ("/tokenize", {"prompt": "x"}),
            ("/detokenize", {"tokens": [1]}),
            ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": "x"}]}),
            ("/v1/completions/render", {"prompt": "x"}),
        ]:
            answer = await client.post(path, json=body)
            assert answer.status_code == 501, path
            assert answer.json()["error"]["code"] == "tokenizer_unavailable"


async def test_routes_are_in_openapi(texted):
    async with texted.client() as client:
        spec = (await client.get("/openapi.json")).json()
    for path in (
        "/tokenize",
        "/detokenize",
        "/v1/chat/completions/render",
        "/v1/completions/render",
    ):
        assert "post" in spec["paths"][path]

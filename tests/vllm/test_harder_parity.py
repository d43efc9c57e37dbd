"""The harder tiny Llama end to end: the direct path answers what ``vllm serve`` answers.

The session's model (``tools/tiny_llama.py``) has a one-line chat template and vLLM's own
sampling defaults. This module builds the harder one (``--harder``): a chat template with a
system prompt, tools rendered with ``tojson``, ``namespace``, content parts and
``raise_exception``; added tokens, special (skipped unless asked) and not; a
``generation_config.json`` with sampling defaults none of vLLM's and two EOS ids; a
vocabulary trained on accented, CJK and emoji text. It starts ``vllm serve`` and a headless
EngineCore on it, once for the module, and holds trioserve's direct path to vLLM's answers
over JSON, SSE and the WebSocket: text, ``finish_reason``, ``stop_reason``, ``usage``,
logprobs, and the 400 of a template that refuses the conversation.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from tests.helpers.enginecore_session import (
    DirectFrontend,
    HeadlessEngine,
    start_direct_frontend,
    start_headless_engine,
)
from tests.helpers.processes import free_port
from tests.helpers.vllm import (
    CHAT,
    COMPLETIONS,
    completion,
    essentials,
    post_json,
    stream_essentials,
    stream_logprobs,
    websocket_chunks,
)
from tests.helpers.vllm_session import ROOT, START_GUARD, VLLM_OPTIONS, answers, start, vllm_env
from tools.toolkit.processes import tool_command
from trioserve.text.assets import ModelText

pytestmark = pytest.mark.integration

SYSTEM = "Tu es un assistant serviable. Réponds brièvement, 谢谢! 🙂"
MIXED = "Grüße aus Köln, crème brûlée, 你好，世界！ 👩‍💻 👍🏽"  # noqa: RUF001
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city (Zürich, 東京, …)",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@attrs.frozen
class Harder:
    model_dir: Path
    reference_url: str
    engine: HeadlessEngine
    text: ModelText


@pytest.fixture(scope="module")
def harder(
    tiny_model: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harder]:
    python, _ = tiny_model
    where = tmp_path_factory.mktemp("harder")
    model_dir = where / "harder-llama"
    subprocess.run(
        [*tool_command("tiny_llama", python), "--harder", str(model_dir)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env=vllm_env(),
        timeout=START_GUARD,
    )
    port = free_port()
    reference = start(
        python,
        ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
        + ["--host", "127.0.0.1", "--port", str(port), *VLLM_OPTIONS],
        where / "reference.log",
    )
    try:
        engine_dir = where / "enginecore"
        engine_dir.mkdir()
        engine = start_headless_engine(python, model_dir, engine_dir)  # loads meanwhile
        try:
            url = f"http://127.0.0.1:{port}"
            reference.wait_for(lambda: answers(url + "/health"), "vLLM's API server (harder)")
            yield Harder(model_dir, url, engine, ModelText.load(model_dir))
        finally:
            engine.process.stop()
    finally:
        reference.stop()


async def direct(nursery: trio.Nursery, harder: Harder) -> DirectFrontend:
    return await start_direct_frontend(nursery, harder.engine, harder.text)


def conversation(*messages: dict[str, Any], **params: Any) -> dict[str, Any]:
    return {"messages": list(messages), **params}


def system(content: Any) -> dict[str, Any]:
    return {"role": "system", "content": content}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text} for text in texts]


#: JSON answers compared; those marked are streamed (SSE) too.
CASES = {
    "system prompt, accents, CJK and emoji": (
        CHAT,
        conversation(system(SYSTEM), user(MIXED), max_tokens=32, temperature=0),
        True,
    ),
    "content parts in the system prompt and the question": (
        CHAT,
        conversation(
            system(parts("Sois bref. ", "简短回答。")),
            user(parts("Wie ist das Wetter ", "in München? ☔")),
            max_tokens=32,
            temperature=0,
        ),
        True,
    ),
    "tools rendered with tojson (tool_choice none)": (
        CHAT,
        conversation(user("Quel temps fait-il à Zürich ?"), tools=TOOLS, tool_choice="none")
        | {"max_tokens": 32, "temperature": 0},
        False,
    ),
    "the model's sampling defaults and its two EOS ids": (
        CHAT,
        conversation(user(MIXED), seed=5),
        True,
    ),
    "special tokens kept, no spaces between them": (
        CHAT,
        conversation(
            user("Répète <|end|> et <tool_call> 🎉"),
            max_tokens=48,
            temperature=0,
            ignore_eos=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
        ),
        True,
    ),
    "a completion of accented and CJK text, its defaults": (
        COMPLETIONS,
        completion("Ærøskøbing et 東京 sont", seed=3),
        True,
    ),
    "a completion with seeded sampling of its own": (
        COMPLETIONS,
        completion(MIXED, max_tokens=40, temperature=1.1, top_p=0.95, min_p=0.02, seed=21),
        False,
    ),
}


@pytest.mark.parametrize("case", CASES)
async def test_json_answers_match_vllm_serve(harder: Harder, nursery, case: str) -> None:
    path, body, _ = CASES[case]
    frontend = await direct(nursery, harder)
    ours = await post_json(frontend.frontend.url, path, body)
    theirs = await post_json(harder.reference_url, path, body)
    assert theirs.status_code == 200, theirs.text
    assert ours.status_code == 200, ours.text
    assert essentials(ours.json()) == essentials(theirs.json())


@pytest.mark.parametrize("case", [case for case, (_, _, streamed) in CASES.items() if streamed])
async def test_streamed_answers_match_vllm_serve(harder: Harder, nursery, case: str) -> None:
    path, body, _ = CASES[case]
    frontend = await direct(nursery, harder)
    ours = await stream_essentials(frontend.frontend.url, path, body)
    theirs = await stream_essentials(harder.reference_url, path, body)
    assert ours == theirs


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, conversation(system(SYSTEM), user(MIXED), max_tokens=16, logprobs=True)),
        (CHAT, conversation(user(MIXED), max_tokens=16, logprobs=True, top_logprobs=3)),
        (COMPLETIONS, completion(MIXED, max_tokens=16, logprobs=3)),
    ],
)
async def test_logprobs_match_vllm_serve(harder: Harder, nursery, path, body) -> None:
    """Greedy, so that both sides take the same tokens: their log probabilities and the
    alternatives' token strings (byte-level tokens that are parts of characters spelled as
    vLLM spells them), in JSON and streamed."""
    body = {**body, "temperature": 0}
    frontend = await direct(nursery, harder)
    ours = await post_json(frontend.frontend.url, path, body)
    theirs = await post_json(harder.reference_url, path, body)
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    assert ours.json()["choices"][0]["logprobs"] == theirs.json()["choices"][0]["logprobs"]
    streamed = await stream_logprobs(frontend.frontend.url, path, body)
    assert streamed == await stream_logprobs(harder.reference_url, path, body)


async def test_a_stop_string_ends_both_the_same(harder: Harder, nursery) -> None:
    body = conversation(system(SYSTEM), user(MIXED), max_tokens=48, temperature=0)
    frontend = await direct(nursery, harder)
    greedy = (await post_json(frontend.frontend.url, CHAT, body)).json()
    text = greedy["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), text
    stopped = {**body, "stop": [stop]}
    ours = await post_json(frontend.frontend.url, CHAT, stopped)
    theirs = await post_json(harder.reference_url, CHAT, stopped)
    assert essentials(ours.json()) == essentials(theirs.json())
    assert essentials(ours.json())["stop_reason"] == stop
    assert await stream_essentials(frontend.frontend.url, CHAT, stopped) == essentials(
        theirs.json()
    )


async def test_the_websocket_streams_what_vllm_serve_answers(harder: Harder, nursery) -> None:
    path, body, _ = CASES["system prompt, accents, CJK and emoji"]
    frontend = await direct(nursery, harder)
    theirs = essentials((await post_json(harder.reference_url, path, body)).json())
    chunks, usage = await websocket_chunks(frontend.frontend.url, path, body)
    text = "".join(c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"])
    assert text == theirs["text"]
    assert [usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]] == theirs[
        "usage"
    ]


async def test_a_conversation_the_template_refuses_is_a_400_on_both(harder: Harder, nursery):
    """The template's raise_exception (no turn to answer after the system prompt)."""
    body = conversation(system(SYSTEM), max_tokens=4)
    frontend = await direct(nursery, harder)
    ours = await post_json(frontend.frontend.url, CHAT, body)
    theirs = await post_json(harder.reference_url, CHAT, body)
    assert (ours.status_code, theirs.status_code) == (400, 400), (ours.text, theirs.text)
    assert "No messages to answer" in ours.json()["error"]["message"]
    assert "No messages to answer" in theirs.json()["error"]["message"]

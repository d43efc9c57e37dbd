"""The mock engine: a deterministic backend of the SDK, with faults on demand.

Text is a fixed function of the prompt and the token index, so tests can predict every
token. Timing: the first token after ``ttft_ms``, then one token per ``1/tokens_per_second``
seconds, aligned to a shared step grid so that concurrent requests produce their tokens in
the same step and leave in one frame, as a real batching engine's would.

Per-request knobs, read from ``Submit.params`` (the HTTP routes pass every body field they
do not know through to the engine, these included):

- ``mock_ttft_ms``, ``mock_tokens_per_second``: override the engine's timing;
- ``mock_error_after`` (tokens) with ``mock_error_status`` (default 500) and
  ``mock_error_message``: end the request with an engine error after N tokens;
- ``mock_hang_after`` (tokens): stop producing after N tokens and wait to be aborted;
- ``mock_stall_s``: block the whole engine (its event loop) for that many seconds before
  the first token, as a hung GPU would; heartbeats stop too.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import sniffio

from ..protocol import ModelCard, Submit, Usage
from .core import Output, RequestError

WORDS = tuple(
    (
        "the quick brown fox jumps over lazy dogs while seven wise owls count silver stars "
        "under a quiet northern sky and distant rivers hum old songs of patient stone"
    ).split()
)

DEFAULT_MAX_TOKENS = 16


async def _sleep(seconds: float) -> None:
    if seconds <= 0:
        return
    if sniffio.current_async_library() == "trio":
        import trio

        await trio.sleep(seconds)
    else:
        import asyncio

        await asyncio.sleep(seconds)


async def _sleep_forever() -> None:
    if sniffio.current_async_library() == "trio":
        import trio

        await trio.sleep_forever()
    else:
        import asyncio

        await asyncio.Event().wait()


def prompt_text(request: Submit) -> str:
    """The text the mock engine 'reads': the prompt, or the chat messages' text."""
    inputs = request.inputs
    if "prompt" in inputs:
        prompt = inputs["prompt"]
        return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    parts = []
    for message in inputs.get("messages", ()):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
    return "\n".join(parts)


def token_text(prompt: str, index: int) -> str:
    """Token ``index`` of the answer to ``prompt``: deterministic, a word with a space."""
    seed = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=4).digest(), "little")
    return " " + WORDS[(seed + index * 7) % len(WORDS)]


def expected_text(prompt: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> str:
    return "".join(token_text(prompt, i) for i in range(max_tokens))


def _number(params: dict[str, Any], name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(400, f"{name} must be a number")
    return value


def _optional_int(params: dict[str, Any], name: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(400, f"{name} must be a number of tokens")
    return int(value)


class MockBackend:
    """See the module docstring. ``engine_id`` names it in the welcome."""

    capabilities = ["chat", "completion"]

    def __init__(
        self,
        *,
        model: str = "mock",
        tokens_per_second: float = 50.0,
        ttft_ms: float = 20.0,
        engine_id: str = "mock",
    ) -> None:
        self.engine_id = engine_id
        self.models = [ModelCard(model)]
        self.tokens_per_second = tokens_per_second
        self.ttft_ms = ttft_ms

    async def generate(self, request: Submit) -> AsyncIterator[Output]:
        params = request.params
        max_tokens = params.get("max_tokens")
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(400, "max_tokens must be a positive integer", "invalid_request")
        rate = _number(params, "mock_tokens_per_second", self.tokens_per_second)
        ttft = _number(params, "mock_ttft_ms", self.ttft_ms) / 1000
        error_after = _optional_int(params, "mock_error_after")
        hang_after = _optional_int(params, "mock_hang_after")
        stall = _number(params, "mock_stall_s", 0)

        prompt = prompt_text(request)
        if stall > 0:
            time.sleep(stall)  # noqa: ASYNC251 - deliberately blocks the engine's loop: a hung engine
        period = 1.0 / rate if rate > 0 else 0.0
        await _sleep(ttft)
        for index in range(max_tokens):
            if index and period:
                # Align to the engine-wide step grid so concurrent requests share steps.
                now = time.monotonic()
                await _sleep(math.ceil(now / period) * period - now or period)
            if hang_after is not None and index >= hang_after:
                await _sleep_forever()
            if error_after is not None and index >= error_after:
                raise RequestError(
                    int(params.get("mock_error_status", 500)),
                    str(params.get("mock_error_message", "mock engine failure")),
                )
            last = index == max_tokens - 1
            yield Output(
                data=token_text(prompt, index),
                usage=Usage(len(prompt.split()), max_tokens) if last else None,
                finish_reason="length" if last else None,
            )

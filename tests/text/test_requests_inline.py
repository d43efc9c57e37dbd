"""Which requests the text layer prepares in the event loop, not in a worker thread
(``text.requests.small_enough_inline``): short text only; anything the template renders at
length (tools, documents, a template of the request's own, tool calls, media) goes to a
thread, where it cannot hold up other requests' streams."""

from __future__ import annotations

import pytest

from trioserve.text.requests import INLINE_CHARS, small_enough_inline


def chat(*messages: dict) -> dict:
    return {"messages": list(messages)}


@pytest.mark.parametrize(
    ("task", "inputs", "params", "inline"),
    [
        ("chat", chat({"role": "user", "content": "Hello"}), {}, True),
        ("chat", chat({"role": "user", "content": "x" * INLINE_CHARS}), {}, True),
        ("chat", chat({"role": "user", "content": "x" * (INLINE_CHARS + 1)}), {}, False),
        (
            "chat",
            chat(
                {"role": "system", "content": "x" * (INLINE_CHARS // 2)},
                {"role": "user", "content": "x" * (INLINE_CHARS // 2 + 1)},
            ),
            {},
            False,
        ),
        ("chat", chat({"role": "user", "content": [{"type": "text", "text": "Hi"}]}), {}, True),
        (
            "chat",
            chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
            {},
            False,
        ),
        ("chat", chat({"role": "assistant", "content": None, "tool_calls": []}), {}, False),
        ("chat", chat({"role": "user", "content": "Hi"}), {"tools": [{"type": "function"}]}, False),
        ("chat", chat({"role": "user", "content": "Hi"}), {"chat_template": "{{ 1 }}"}, False),
        ("completion", {"prompt": "Hello"}, {}, True),
        ("completion", {"prompt": "x" * (INLINE_CHARS + 1)}, {}, False),
        ("completion", {"prompt": [1, 2, 3]}, {}, True),
    ],
)
def test_short_text_is_prepared_inline_and_the_rest_in_a_thread(task, inputs, params, inline):
    assert small_enough_inline(task, inputs, params) is inline

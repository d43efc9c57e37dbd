from __future__ import annotations

import pytest

from trioserve.errors import PromptTooLongError, TextInputError
from trioserve.text.assets import ModelText
from trioserve.text.prompts import chat_prompt
from trioserve.text.registry import ServedText
from trioserve.text.requests import UNTRUSTED_TEMPLATE, prepare
from trioserve.text.sampling import EngineLimits
from trioserve.text.template import ChatOptions

MESSAGES = [{"role": "user", "content": "Grüße 日本 🙂"}]


def served(model: ModelText, max_model_len: int = 200) -> ServedText:
    return ServedText(model, EngineLimits(max_model_len))


def test_chat_request_is_prompt_ids_and_lowered_params(harder: ModelText):
    ready = prepare(
        served(harder), "chat", {"messages": MESSAGES}, {"max_tokens": 5, "seed": 1}, stream=True
    )
    assert ready.prompt.token_ids == chat_prompt(harder, MESSAGES, ChatOptions()).token_ids
    assert ready.sampling.params["max_tokens"] == 5
    assert ready.sampling.params["output_kind"] == 1  # DELTA: streamed


def test_completion_request_takes_text_or_ids(plain: ModelText):
    text = prepare(served(plain), "completion", {"prompt": "Once"}, {}, stream=False)
    assert text.prompt.token_ids == plain.encode("Once", add_special_tokens=True)
    ids = prepare(served(plain), "completion", {"prompt": [5, 6]}, {}, stream=False)
    assert ids.prompt.token_ids == [5, 6]


def test_engine_rules_apply_only_for_the_engine(plain: ModelText):
    with pytest.raises(TextInputError, match="cannot be empty"):
        prepare(served(plain), "completion", {"prompt": ""}, {}, stream=False)
    rendered = prepare(
        served(plain), "completion", {"prompt": ""}, {}, stream=False, for_engine=False
    )
    assert rendered.prompt.token_ids == []
    with pytest.raises(PromptTooLongError):
        prepare(served(plain, 3), "completion", {"prompt": "The quick brown fox"}, {}, stream=False)


def test_a_requests_own_template_is_refused(plain: ModelText):
    with pytest.raises(TextInputError) as caught:
        prepare(served(plain), "chat", {"messages": MESSAGES}, {"chat_template": "x"}, stream=False)
    assert caught.value.message == UNTRUSTED_TEMPLATE


def test_continue_final_message_turns_off_the_generation_prompt(plain: ModelText):
    messages = [*MESSAGES, {"role": "assistant", "content": "Hallo"}]
    ready = prepare(
        served(plain),
        "chat",
        {"messages": messages},
        {"continue_final_message": True},
        stream=False,
    )
    assert plain.decode(ready.prompt.token_ids).endswith("<|assistant|>\nHallo")
    with pytest.raises(TextInputError, match="Cannot set both"):
        prepare(
            served(plain),
            "chat",
            {"messages": messages},
            {"continue_final_message": True, "add_generation_prompt": True},
            stream=False,
        )

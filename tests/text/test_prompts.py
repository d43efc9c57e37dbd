from __future__ import annotations

import pytest

from trioserve.errors import PromptTooLongError, TextInputError
from trioserve.http.errors import http_error
from trioserve.text.assets import ModelText
from trioserve.text.prompts import chat_prompt, check_prompt_length, completion_prompt


def test_chat_prompt_has_the_templates_bos_once(plain: ModelText):
    prompt = chat_prompt(plain, [{"role": "user", "content": "Hello"}])
    assert prompt.token_ids[0] == plain.bos_token_id
    assert prompt.token_ids.count(plain.bos_token_id) == 1
    assert plain.decode(prompt.token_ids) == prompt.text


def test_completion_prompt_string_and_token_ids(plain: ModelText):
    prompt = completion_prompt(plain, "Grüße 日本語")
    assert plain.decode(prompt.token_ids) == "Grüße 日本語"
    assert completion_prompt(plain, [5, 6, 7]).token_ids == [5, 6, 7]
    with pytest.raises(TextInputError, match="Token id 100000 is out of vocabulary"):
        completion_prompt(plain, [5, 100000])
    with pytest.raises(TextInputError, match="Token id -1 is out of vocabulary"):
        completion_prompt(plain, [-1])


def test_prompt_longer_than_the_context_is_vllms_400(plain: ModelText):
    with pytest.raises(PromptTooLongError, match="maximum context length is 4 tokens") as caught:
        completion_prompt(plain, "The quick brown fox jumps", max_model_len=4)
    assert http_error(caught.value).status == 400  # what the client reads
    with pytest.raises(PromptTooLongError, match="characters"):
        completion_prompt(plain, "x" * 10_000, max_model_len=4)


def test_prompt_length_rules_of_the_input_processor():
    with pytest.raises(TextInputError, match="cannot be empty"):
        check_prompt_length(0, 10)
    with pytest.raises(PromptTooLongError, match=r"plus the number of requested output tokens"):
        check_prompt_length(10, 10)
    check_prompt_length(9, 10)

from __future__ import annotations

import pytest

from trioserve.errors import PromptTooLongError, TextInputError
from trioserve.http.errors import http_error
from trioserve.text.assets import ModelText, SamplingDefaults
from trioserve.text.sampling import EngineLimits, lower

LIMITS = EngineLimits(max_model_len=100)


def chat(model, prompt_len=10, limits=LIMITS, **params):
    return lower(params, endpoint="chat", prompt_len=prompt_len, model=model, limits=limits)


def test_generation_config_defaults_apply_under_the_request(harder: ModelText):
    p = chat(harder).params
    assert (p["temperature"], p["top_p"], p["top_k"], p["repetition_penalty"]) == (
        0.7,
        0.9,
        40,
        1.05,
    )
    assert p["max_tokens"] == 48  # max_new_tokens
    assert chat(harder, temperature=0.2, max_tokens=90).params["temperature"] == 0.2
    # vllm's --generation-config vllm: none of the model's defaults
    plain = chat(harder, limits=EngineLimits(100, generation_config="vllm")).params
    assert (plain["temperature"], plain["top_k"], plain["max_tokens"]) == (1.0, 0, 90)


def test_override_generation_config_goes_over_the_models_and_caps_max_tokens(
    harder: ModelText,
):
    override = {"temperature": 0.3, "top_k": None, "max_new_tokens": 20}
    limits = EngineLimits(100, override_generation_config=override)
    p = chat(harder, limits=limits).params
    assert (p["temperature"], p["top_k"], p["top_p"], p["max_tokens"]) == (0.3, 0, 0.9, 20)
    # vLLM's serving classes cap every request at the override's max_new_tokens.
    assert chat(harder, limits=limits, max_tokens=50).params["max_tokens"] == 20
    # ...and with --generation-config vllm, the override alone.
    alone = EngineLimits(100, generation_config="vllm", override_generation_config=override)
    p = chat(harder, limits=alone).params
    assert (p["temperature"], p["top_p"], p["max_tokens"]) == (0.3, 1.0, 20)


def test_a_generation_config_directory_replaces_the_models_defaults_and_eos(
    harder: ModelText,
):
    folder = SamplingDefaults.from_config(
        {"temperature": 0.5, "max_new_tokens": 12, "eos_token_id": [harder.eos_token_id, 7]}
    )
    limits = EngineLimits(100, generation_config="/some/dir", generation=folder)
    p = chat(harder, limits=limits).params
    assert (p["temperature"], p["top_p"], p["max_tokens"]) == (0.5, 1.0, 12)
    assert chat(harder, limits=limits, max_tokens=50).params["max_tokens"] == 12
    assert p["stop_token_ids"] == [7]


def test_eos_and_the_extra_eos_id(harder: ModelText):
    end = harder.tokenizer.token_to_id("<|end|>")
    p = chat(harder, stop_token_ids=[5]).params
    assert p["_eos_token_id"] == harder.eos_token_id
    assert p["stop_token_ids"] == sorted({5, end})
    assert p["_all_stop_token_ids"] == sorted({5, end, harder.eos_token_id})
    ignoring = chat(harder, ignore_eos=True).params
    assert ignoring["_eos_token_id"] is None
    assert ignoring["stop_token_ids"] == []
    assert end in ignoring["_all_stop_token_ids"]


def test_max_tokens_from_the_remaining_context_and_its_400s(plain: ModelText):
    assert chat(plain, prompt_len=30).params["max_tokens"] == 70
    assert chat(plain, prompt_len=30, max_tokens=80).params["max_tokens"] == 70
    with pytest.raises(PromptTooLongError, match="max_tokens=101 cannot be greater than"):
        chat(plain, max_tokens=101)
    with pytest.raises(TextInputError, match="max_tokens must be at least 1, got 0"):
        chat(plain, prompt_len=100)
    completion = lower({}, endpoint="completion", prompt_len=3, model=plain, limits=LIMITS)
    assert completion.params["max_tokens"] == 16  # CompletionRequest's default


@pytest.mark.parametrize(
    ("params", "param", "message"),
    [
        ({"n": 0}, "n", "n must be at least 1, got 0."),
        ({"temperature": -1}, "temperature", "temperature must be non-negative"),
        ({"temperature": 3}, "temperature", "temperature must be in [0, 2]"),
        ({"temperature": float("nan")}, "temperature", "finite"),
        ({"top_p": 0}, "top_p", "top_p must be in (0, 1]"),
        ({"top_k": -2}, "top_k", "top_k must be 0 (disable)"),
        ({"min_p": 1.5}, "min_p", "min_p must be in [0, 1]"),
        ({"presence_penalty": 3}, "presence_penalty", "presence_penalty must be in [-2, 2]"),
        ({"repetition_penalty": 0}, "repetition_penalty", "greater than zero"),
        ({"min_tokens": 50, "max_tokens": 10}, "min_tokens", "less than or equal"),
        ({"stop": ["a", ""]}, "stop", "stop cannot contain an empty string."),
        ({"n": 2, "temperature": 0}, "n", "n must be 1 when using greedy sampling"),
        ({"stop_token_ids": [10**6]}, "stop_token_ids", "out-of-vocab"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "cannot be converted"),
        ({"logit_bias": {"100000": 1}}, "logit_bias", "out-of-vocab"),
        ({"allowed_token_ids": []}, "allowed_token_ids", "empty"),
        ({"logprobs": True, "top_logprobs": 21}, "logprobs", "greater than max allowed: 20"),
        ({"top_logprobs": 2}, "top_logprobs", "`logprobs` must be set to true"),
        ({"bad_words": [""]}, "bad_words", "empty string"),
        ({"seed": "1"}, "seed", "must be an integer"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs", "empty list"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "one"),
    ],
)
def test_what_vllm_refuses_is_a_400_naming_the_parameter(plain, params, param, message):
    with pytest.raises(TextInputError) as caught:
        chat(plain, **params)
    assert http_error(caught.value).status == 400  # what the client reads
    assert caught.value.param == param
    assert message in caught.value.message


def test_greedy_resets_top_p_top_k_min_p(harder: ModelText):
    p = chat(harder, temperature=0).params
    assert (p["top_p"], p["top_k"], p["min_p"]) == (1.0, 0, 0.0)


def test_n_choices_seeded_seed_plus_i(plain: ModelText):
    sampling = chat(plain, n=3, seed=7, temperature=1)
    assert sampling.n == 3 and sampling.params["n"] == 1
    assert [sampling.choice(i)["seed"] for i in range(3)] == [7, 8, 9]
    unseeded = chat(plain, n=2, temperature=1)
    assert unseeded.choice(1)["seed"] is None


def test_bad_words_become_token_ids_alone_and_after_a_space(plain: ModelText):
    p = chat(plain, bad_words=["fox"]).params
    assert plain.encode("fox", add_special_tokens=False) in p["_bad_words_token_ids"]


def test_structured_outputs_get_their_backend(plain: ModelText):
    so = chat(plain, response_format={"type": "json_object"}).params["structured_outputs"]
    assert so["json_object"] is True and so["_backend"] == "xgrammar"
    schema = {"type": "object"}
    so = chat(
        plain,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    ).params["structured_outputs"]
    assert so["json"] == schema
    limits = EngineLimits(100, structured_outputs_backend="guidance")
    so = chat(plain, limits=limits, structured_outputs={"regex": "a+"}).params
    assert so["structured_outputs"]["_backend"] == "guidance"


def test_stream_output_kind_and_stop_buffer(plain: ModelText):
    p = lower(
        {"stop": ["abc", "z"]},
        endpoint="chat",
        prompt_len=1,
        model=plain,
        limits=LIMITS,
        stream=True,
    ).params
    assert (p["output_kind"], p["output_text_buffer_length"]) == (1, 2)


@pytest.mark.parametrize("name", ["truncate_prompt_tokens", "use_beam_search", "suffix"])
def test_what_the_pipeline_does_not_implement_is_refused_not_ignored(plain, name):
    with pytest.raises(TextInputError) as caught:
        chat(plain, **{name: 5})
    assert caught.value.param == name

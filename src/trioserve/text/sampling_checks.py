"""The checks of vLLM's ``SamplingParams._verify_args``, message for message, and of the
logprob token ids ``SamplingParams.verify`` bounds: what EngineCore would refuse when it
decodes an ADD (a refusal there kills its input thread), refused here first, each a
:class:`~trioserve.errors.TextInputError` naming the parameter (``sampling.py`` lowers
the request and runs them)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import TextInputError

#: vLLM's constants (``vllm/sampling_params.py``, ``vllm/envs.py``).
MAX_LOGPROB_TOKEN_IDS = 128
MAX_N_SEQUENCES = 16384


def fail(message: str, param: str | None) -> TextInputError:
    """The refusal of ``param``, with vLLM's ``message``."""
    return TextInputError(message, param=param)


def verify_args(
    n: int,
    values: dict[str, Any],
    max_tokens: int,
    min_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None,
    stop: list[str],
    stop_token_ids: list[int],
    bad_words: list[str],
    stream_interval: int | None,
) -> None:
    """``SamplingParams._verify_args``, message for message."""
    if n < 1:
        raise fail(f"n must be at least 1, got {n}.", "n")
    if n > MAX_N_SEQUENCES:
        raise fail(
            f"n must be at most {MAX_N_SEQUENCES}, got {n}. To increase this limit, set the "
            "VLLM_MAX_N_SEQUENCES environment variable.",
            "n",
        )
    for name in ("presence_penalty", "frequency_penalty"):
        value = values[name]
        if not -2.0 <= value <= 2.0:
            raise fail(f"{name} must be in [-2, 2], got {value}.", name)
    repetition = values["repetition_penalty"]
    if not math.isfinite(repetition):
        raise fail(
            f"repetition_penalty must be a finite number, got {repetition}.",
            "repetition_penalty",
        )
    if repetition <= 0.0:
        raise fail(
            f"repetition_penalty must be greater than zero, got {repetition}.",
            "repetition_penalty",
        )
    temperature = values["temperature"]
    if not math.isfinite(temperature):
        raise fail(f"temperature must be a finite number, got {temperature}.", "temperature")
    if temperature < 0.0:
        raise fail(f"temperature must be non-negative, got {temperature}.", "temperature")
    if temperature > 2.0:
        raise fail(f"temperature must be in [0, 2], got {temperature}.", "temperature")
    top_p = values["top_p"]
    if not 0.0 < top_p <= 1.0:  # (NaN fails too)
        raise fail(f"top_p must be in (0, 1], got {top_p}.", "top_p")
    top_k = values["top_k"]
    if not isinstance(top_k, int):
        raise fail(f"top_k must be an integer, got {type(top_k).__name__}", "top_k")
    if top_k < -1:
        raise fail(f"top_k must be 0 (disable), or at least 1, got {top_k}.", "top_k")
    min_p = values["min_p"]
    if not 0.0 <= min_p <= 1.0:
        raise fail(f"min_p must be in [0, 1], got {min_p}.", "min_p")
    if max_tokens < 1:
        raise fail(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    if min_tokens < 0:
        raise fail(
            f"min_tokens must be greater than or equal to 0, got {min_tokens}.", "min_tokens"
        )
    if min_tokens > max_tokens:
        raise fail(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
            "min_tokens",
        )
    if stream_interval is not None and stream_interval < 1:
        raise fail(f"stream_interval must be at least 1, got {stream_interval}.", "stream_interval")
    if logprobs is not None and logprobs < -1:
        raise fail(f"logprobs must be non-negative or -1, got {logprobs}.", "logprobs")
    if prompt_logprobs is not None and prompt_logprobs < -1:
        raise fail(
            f"prompt_logprobs must be non-negative or -1, got {prompt_logprobs}.",
            "prompt_logprobs",
        )
    if any(not s for s in stop):
        raise fail("stop cannot contain an empty string.", "stop")
    if any(not w for w in bad_words):
        raise fail(
            f"bad_words cannot contain an empty string. Got bad_words={bad_words}", "bad_words"
        )
    del stop_token_ids  # (integers: the reader checked)


def check_logprob_token_ids(ids: list[int], logprobs: int | None, vocab: int) -> None:
    if len(ids) > MAX_LOGPROB_TOKEN_IDS:
        raise fail(
            f"Requested logprob_token_ids of length {len(ids)}, which is greater than max "
            f"allowed: {MAX_LOGPROB_TOKEN_IDS}",
            "logprob_token_ids",
        )
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise fail(
            f"token_id(s) {bad} in logprob_token_ids contain out-of-vocab token ids. "
            f"Vocabulary size: {vocab}",
            "logprob_token_ids",
        )

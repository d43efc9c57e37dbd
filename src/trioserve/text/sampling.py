"""OpenAI-style request parameters lowered to vLLM's ``SamplingParams``, validated as vLLM
validates them.

The result is a plain dict keyed by ``SamplingParams`` field names (what the EngineCore
codec encodes as a msgpack map), in the state vLLM's own frontend leaves it in before the
ADD: the serving layer's defaults (``to_sampling_params``: request, then the model's
``generation_config.json`` via ``get_diff_sampling_param``, then OpenAI's), ``max_tokens``
from the remaining context (``get_max_tokens``), ``__post_init__``'s normalisation (a stop
string list, greedy sampling resetting top_p/top_k/min_p, ``output_text_buffer_length``),
then the input processor's ``update_from_generation_config`` (``_eos_token_id``, extra EOS
ids into ``stop_token_ids`` and ``_all_stop_token_ids``) and ``update_from_tokenizer``
(``bad_words`` into ``_bad_words_token_ids``).

Validation is everything vLLM refuses on the way: the request models' checks, the
``SamplingParams._verify_args`` that EngineCore re-runs when it decodes an ADD (where a
failure kills its input thread: the engine then ignores every request, silently;
``sampling_checks.py``), and
``SamplingParams.verify`` (vocabulary bounds, logprob limits, structured outputs). Each
refusal is a :class:`~trioserve.errors.TextInputError` naming the parameter, with vLLM's
message.

``n`` > 1 is ``n`` engine requests (:meth:`Sampling.choice`): each ``n = 1``, seeded
``seed + i`` when a seed is given (vLLM's ``ParentRequest``).
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from ..errors import PromptTooLongError
from .assets import SAMPLING_DEFAULT_FIELDS, ModelText, SamplingDefaults
from .detokenizer import IncrementalDetokenizer
from .sampling_checks import check_logprob_token_ids, fail, verify_args
from .stops import hold_back
from .structured import structured_outputs

#: vLLM's constants (``vllm/sampling_params.py``, ``vllm/envs.py``).
SAMPLING_EPS = 1e-5
MIN_TEMPERATURE = 1e-2
MAX_NUM_BAD_WORDS = 128
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: ``RequestOutputKind``'s values.
OUTPUT_DELTA, OUTPUT_FINAL_ONLY = 1, 2
#: OpenAI's defaults, under the model's (``_DEFAULT_SAMPLING_PARAMS``).
OPENAI_DEFAULTS: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}


#: vLLM request fields this pipeline does not implement: refused, never silently ignored
#: (the answer would differ from vLLM's).
UNSUPPORTED = (
    "use_beam_search",
    "truncate_prompt_tokens",
    "truncation_side",
    "thinking_token_budget",
    "repetition_detection",
    "vllm_xargs",
    "kv_transfer_params",
    "ec_transfer_params",
    "prompt_embeds",
    "watermarking",
    "suffix",
)


@attrs.frozen
class EngineLimits:
    """What the engine registered with, and vLLM's server options that shape validation."""

    max_model_len: int
    #: ``--max-logprobs`` (vLLM's default 20; -1: the vocabulary).
    max_logprobs: int = 20
    #: ``--structured-outputs-config.backend`` (vLLM's default ``auto``).
    structured_outputs_backend: str = "auto"
    #: ``--generation-config``: ``auto`` (the model's defaults), ``vllm`` (none), or a
    #: directory, whose ``generation_config.json`` is then :attr:`generation`.
    generation_config: str = "auto"
    #: The defaults and EOS ids of a ``--generation-config`` directory (None: the model's).
    generation: SamplingDefaults | None = None
    #: ``--override-generation-config``: generation config fields over the defaults.
    override_generation_config: dict[str, Any] = attrs.Factory(dict)

    def override_max_tokens(self) -> int | None:
        """The cap on every request's ``max_tokens`` that vLLM's serving classes take
        (``override_max_tokens``): a directory's ``max_new_tokens``, else the override's."""
        if self.generation_config not in ("auto", "vllm"):
            values = self.generation.values if self.generation is not None else {}
            return _override(values, self.override_generation_config).get("max_tokens")
        value = self.override_generation_config.get("max_new_tokens")
        return value if isinstance(value, int) else None

    def eos_token_ids(self, model: ModelText) -> tuple[int, ...]:
        """The generation config's EOS ids (the directory's, else the model's, with
        ``vllm`` too: vLLM's ``try_get_generation_config``)."""
        defaults = self.generation if self.generation is not None else model.sampling_defaults
        return defaults.eos_token_ids


def _override(values: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``override``'s sampling fields over them (``max_new_tokens`` as
    ``max_tokens``; a null removes the default), as ``get_diff_sampling_param`` merges."""
    out = dict(values)
    for name in SAMPLING_DEFAULT_FIELDS:
        if name in override:
            key = "max_tokens" if name == "max_new_tokens" else name
            if override[name] is None:
                out.pop(key, None)
            else:
                out[key] = override[name]
    return out


class _Reader:
    """Typed access to a request's parameters: a wrong type is a 400 naming the field."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    def get(self, name: str) -> Any:
        return self.params.get(name)

    def int_(self, name: str, *, low: int = INT64_MIN, high: int = INT64_MAX) -> int | None:
        value = self.params.get(name)
        if value is None:
            return None
        if type(value) is float and value.is_integer():
            value = int(value)
        if type(value) is not int:
            raise fail(f"{name} must be an integer", name)
        if not low <= value <= high:
            raise fail(f"{name} must be between {low} and {high}, got {value}", name)
        return value

    def float_(self, name: str) -> float | None:
        value = self.params.get(name)
        if value is None:
            return None
        if type(value) not in (int, float):
            raise fail(f"{name} must be a number", name)
        return float(value)

    def bool_(self, name: str, default: bool) -> bool:
        value = self.params.get(name)
        if value is None:
            return default
        if type(value) is not bool:
            raise fail(f"{name} must be a boolean", name)
        return value

    def strings(self, name: str) -> list[str] | None:
        value = self.params.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise fail(f"{name} must be a string or a list of strings", name)
        return list(value)

    def ints(self, name: str) -> list[int] | None:
        value = self.params.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(
            type(i) is int and INT64_MIN <= i <= INT64_MAX for i in value
        ):
            raise fail(f"{name} must be a list of integers", name)
        return list(value)


@attrs.frozen
class Sampling:
    """A request's sampling, lowered: :attr:`params` for the engine (``n`` = 1: one
    engine request per choice, :meth:`choice`), and what the text pipeline needs."""

    params: dict[str, Any]
    #: Choices asked for (``n``).
    n: int = 1
    #: Whether token strings in logprobs are ``token_id:N`` (``return_tokens_as_token_ids``).
    tokens_as_token_ids: bool = False
    #: Whether the answer begins with the prompt (``echo``: a completion's prompt, a
    #: chat's last message when it is the answer's role), and whether it is only that
    #: (``echo`` with ``max_tokens`` 0: one token is generated, and not shown).
    echo: bool = False
    echo_only: bool = False
    #: Whether the answer carries the prompt's and its own token ids (``return_token_ids``).
    return_token_ids: bool = False
    #: The request's place in a priority scheduler's queue (lower first; vLLM's
    #: ``priority``, which its FCFS scheduler ignores).
    priority: int = 0

    def choice(self, index: int) -> dict[str, Any]:
        """The params of choice ``index``: its own seed (``seed + index``) if seeded."""
        seed = self.params.get("seed")
        if seed is None or index == 0:
            return self.params
        return {**self.params, "seed": seed + index}

    def detokenizer(self, model: ModelText, prompt_token_ids: list[int]) -> IncrementalDetokenizer:
        """A detokenizer for one choice of this request."""
        p = self.params
        return IncrementalDetokenizer(
            model,
            prompt_token_ids,
            stop=p["stop"],
            include_stop_str_in_output=p["include_stop_str_in_output"],
            min_tokens=p["min_tokens"],
            skip_special_tokens=p["skip_special_tokens"],
            spaces_between_special_tokens=p["spaces_between_special_tokens"],
        )


def default_sampling(model: ModelText, limits: EngineLimits) -> dict[str, Any]:
    """vLLM's ``default_sampling_params`` (``get_diff_sampling_param``): none with
    ``vllm``, else the directory's or the model's, then the override's over them."""
    if limits.generation_config == "vllm":
        values: dict[str, Any] = {}
    elif limits.generation is not None:
        values = limits.generation.values
    else:
        values = model.sampling_defaults.values
    return _override(values, limits.override_generation_config)


def max_tokens_for(
    limits: EngineLimits,
    requested: int | None,
    prompt_len: int,
    defaults: dict[str, Any],
    param: str,
) -> int:
    """vLLM's ``TokenizeParams`` check (``max_tokens`` beyond the context: 400) and
    ``get_max_tokens`` (the least of what is left, what was asked, the model's default)."""
    max_model_len = limits.max_model_len
    if requested is not None and requested > max_model_len:
        raise PromptTooLongError(
            f"{param}={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param=param,
        )
    if prompt_len > max_model_len:
        raise PromptTooLongError(
            f"Input length ({prompt_len}) exceeds model's maximum context length "
            f"({max_model_len}).",
            param="input_tokens",
        )
    fallback = requested if requested is not None else defaults.get("max_tokens")
    left = max_model_len - prompt_len
    caps = (fallback, limits.override_max_tokens())
    return min([left, *(cap for cap in caps if cap is not None)])


def lower(
    params: dict[str, Any],
    *,
    endpoint: str,
    prompt_len: int,
    model: ModelText,
    limits: EngineLimits,
    stream: bool = False,
) -> Sampling:
    """Lower and validate a request's parameters (``endpoint``: ``"chat"`` or
    ``"completion"``, whose defaults differ). 400 for anything vLLM refuses."""
    r = _Reader(params)
    chat = endpoint == "chat"
    defaults = default_sampling(model, limits)

    for name in UNSUPPORTED:
        if params.get(name) not in (None, False):
            raise fail(f"{name} is not supported on the token-id path yet", name)

    # -- max_tokens --------------------------------------------------------------------
    if chat and params.get("max_completion_tokens") is not None:
        requested, param = r.int_("max_completion_tokens"), "max_completion_tokens"
    else:
        requested, param = r.int_("max_tokens"), "max_tokens"
        if requested is None and not chat:
            requested = 16  # CompletionRequest.max_tokens's default (null too, in vLLM)
    max_tokens = max_tokens_for(limits, requested, prompt_len, defaults, param)
    echo = r.bool_("echo", False)
    if not chat and echo and requested == 0:
        max_tokens = 1  # echo without generation: vLLM generates one token, shows none

    # -- the sampling fields, with their defaults ----------------------------------------
    values: dict[str, Any] = {}
    for name, openai_default in OPENAI_DEFAULTS.items():
        given = r.int_(name) if name == "top_k" else r.float_(name)
        values[name] = given if given is not None else defaults.get(name, openai_default)
    n = r.int_("n")
    n = 1 if n is None else n
    seed = r.int_("seed")
    if seed == -1:
        seed = None
    stop = r.strings("stop") or []
    stop_token_ids = r.ints("stop_token_ids") or []
    min_tokens = r.int_("min_tokens") or 0
    ignore_eos = r.bool_("ignore_eos", False)
    include_stop = r.bool_("include_stop_str_in_output", False)
    skip_special = r.bool_("skip_special_tokens", True)
    spaces_between = r.bool_("spaces_between_special_tokens", True)
    logprobs, prompt_logprobs = _logprobs(r, chat, stream, echo)
    logprob_token_ids = r.ints("logprob_token_ids")
    if logprob_token_ids:
        logprobs = None
    bad_words = list(dict.fromkeys(r.strings("bad_words") or []))
    allowed = r.ints("allowed_token_ids")
    logit_bias = _logit_bias(params.get("logit_bias"))

    temperature = float(values["temperature"])
    if 0 < temperature < MIN_TEMPERATURE:
        temperature = MIN_TEMPERATURE  # vLLM raises it, with a warning
    values["temperature"] = temperature

    verify_args(
        n, values, max_tokens, min_tokens, logprobs, prompt_logprobs, stop, stop_token_ids,
        bad_words, r.int_("stream_interval"),
    )  # fmt: skip
    if temperature < SAMPLING_EPS:
        values.update(top_p=1.0, top_k=0, min_p=0.0)
        if n > 1:
            raise fail(f"n must be 1 when using greedy sampling, got {n}.", "n")

    # -- SamplingParams.verify (the input processor) -----------------------------------------
    vocab = model.vocab_size
    max_logprobs = vocab if limits.max_logprobs == -1 else limits.max_logprobs
    for asked, name in ((logprobs, "logprobs"), (prompt_logprobs, "prompt_logprobs")):
        if asked:
            count = vocab if asked == -1 else asked
            if count > max_logprobs:
                kind = "sample" if name == "logprobs" else "prompt"
                raise fail(
                    f"Requested {kind} logprobs of {count}, which is greater than max "
                    f"allowed: {max_logprobs}",
                    name,
                )
    if logprob_token_ids is not None:
        check_logprob_token_ids(logprob_token_ids, logprobs, vocab)
    for ids, name in ((stop_token_ids, "stop_token_ids"), (list(logit_bias or ()), "logit_bias")):
        if ids:
            model.check_token_ids(ids, name)
    if allowed is not None:
        if not allowed:
            raise fail("allowed_token_ids is not None and empty!", "allowed_token_ids")
        if any(not 0 <= i < vocab for i in allowed):
            raise fail("allowed_token_ids contains out-of-vocab token id!", "allowed_token_ids")
    structured = structured_outputs(params, limits.structured_outputs_backend)

    # -- __post_init__, then the input processor's updates -------------------------------
    stop_token_ids = list(dict.fromkeys(stop_token_ids))
    all_stop = set(stop_token_ids)
    eos = model.eos_token_id
    sp: dict[str, Any] = {
        "n": 1,
        "presence_penalty": values["presence_penalty"],
        "frequency_penalty": values["frequency_penalty"],
        "repetition_penalty": values["repetition_penalty"],
        "temperature": temperature,
        "top_p": values["top_p"],
        "top_k": values["top_k"],
        "min_p": values["min_p"],
        "seed": seed,
        "stop": stop,
        "stop_token_ids": stop_token_ids,
        "ignore_eos": ignore_eos,
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
        "logprob_token_ids": logprob_token_ids or None,
        "skip_special_tokens": skip_special,
        "spaces_between_special_tokens": spaces_between,
        "include_stop_str_in_output": include_stop,
        "output_kind": OUTPUT_DELTA if stream else OUTPUT_FINAL_ONLY,
        "output_text_buffer_length": hold_back(stop, include_stop),
        "structured_outputs": structured,
        "logit_bias": logit_bias,
        "allowed_token_ids": allowed,
        "bad_words": bad_words,
        "skip_reading_prefix_cache": prompt_logprobs is not None,
    }
    stream_interval = r.int_("stream_interval")
    if stream_interval is not None:
        sp["stream_interval"] = stream_interval
    # update_from_generation_config: the primary EOS stops the engine; the generation
    # config's other EOS ids become stop tokens (unless ignore_eos).
    sp["_eos_token_id"] = None if ignore_eos else eos
    if eos is not None:
        all_stop.add(eos)
    extra_eos = set(limits.eos_token_ids(model)) - {eos}
    if extra_eos:
        all_stop.update(extra_eos)
        if not ignore_eos:
            sp["stop_token_ids"] = sorted(extra_eos | set(stop_token_ids))
    sp["_all_stop_token_ids"] = sorted(all_stop)
    if bad_words:
        sp["_bad_words_token_ids"] = bad_words_token_ids(model, bad_words)
    return Sampling(
        sp,
        n,
        r.bool_("return_tokens_as_token_ids", False),
        echo=echo,
        echo_only=not chat and echo and requested == 0,
        return_token_ids=r.bool_("return_token_ids", False),
        priority=r.int_("priority") or 0,
    )


def _logprobs(r: _Reader, chat: bool, stream: bool, echo: bool) -> tuple[int | None, int | None]:
    """``logprobs`` and ``prompt_logprobs`` for the engine, with the request models' checks
    (chat: ``logprobs`` a boolean and ``top_logprobs`` a count; completions: a count)."""
    prompt_logprobs = r.int_("prompt_logprobs")
    if prompt_logprobs is not None:
        if stream and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise fail("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if prompt_logprobs < -1:
            raise fail("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs")
    if chat:
        asked = r.bool_("logprobs", False)
        top = r.int_("top_logprobs")
        if top is not None:
            if top < -1:
                raise fail("`top_logprobs` must be a positive value or -1.", "top_logprobs")
            if (top == -1 or top > 0) and not asked:
                raise fail(
                    "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
                )
        if r.get("logprob_token_ids") and not asked:
            raise fail(
                "when using `logprob_token_ids`, `logprobs` must be set to true.",
                "logprob_token_ids",
            )
        logprobs = (top or 0) if asked else None
        if prompt_logprobs is None and echo:
            prompt_logprobs = top if top is not None else 0
        return logprobs, prompt_logprobs
    count = r.int_("logprobs")
    if prompt_logprobs is None and echo:
        prompt_logprobs = count
    return count, prompt_logprobs


def _logit_bias(value: Any) -> dict[int, float] | None:
    """``logit_bias`` with integer keys, each bias clamped to [-100, 100] (vLLM's
    ``from_optional``)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise fail("logit_bias must be an object", "logit_bias")
    out: dict[int, float] = {}
    bad = []
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            bad.append(key)
            continue
        if type(bias) not in (int, float) or not math.isfinite(bias):
            raise fail("logit_bias values must be finite numbers", "logit_bias")
        out[token] = min(100.0, max(-100.0, float(bias)))
    if bad:
        raise fail(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {bad!r}",
            "logit_bias",
        )
    return out


def bad_words_token_ids(model: ModelText, bad_words: list[str]) -> list[list[int]]:
    """vLLM's ``update_from_tokenizer``: each bad word as token ids, alone and after a
    space (when that spells it with as many tokens, starting differently)."""
    found: list[list[int]] = []
    for word in bad_words:
        for prefix in ("", " "):
            ids = model.encode(prefix + word.lstrip(), add_special_tokens=False)
            if not ids:
                if not prefix:
                    raise fail(
                        "bad_words entries must tokenize to at least one token.", "bad_words"
                    )
                continue
            if not prefix or (ids[0] != found[-1][0] and len(ids) == len(found[-1])):
                found.append(ids)
                if len(found) > MAX_NUM_BAD_WORDS:
                    raise fail(
                        f"Too many bad words after tokenization: {len(found)}. The max "
                        f"number is {MAX_NUM_BAD_WORDS}.",
                        "bad_words",
                    )
    return found

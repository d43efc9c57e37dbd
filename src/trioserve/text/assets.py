"""A model directory's text assets, read once per model: :class:`ModelText`.

What is read, and where vLLM reads the same thing:

- ``tokenizer.json``: HF ``tokenizers`` (vLLM loads it through transformers' fast
  tokenizer, whose backend is this very object).
- ``tokenizer_config.json``: the special tokens (``bos_token``, ``eos_token``, ``unk_token``,
  ``pad_token``, ``additional_special_tokens``/``extra_special_tokens``: the template sees
  them as transformers' ``special_tokens_map``), the chat template (a string, a list of
  named templates, or the ``chat_template.jinja`` file beside it, which wins as in
  transformers 5), ``clean_up_tokenization_spaces``.
- ``generation_config.json`` (or, without it, ``config.json``, as
  ``GenerationConfig.from_model_config`` does): the sampling defaults vLLM's
  ``ModelConfig.get_diff_sampling_param`` applies, and extra EOS ids.
- ``config.json``: ``max_position_embeddings`` (for information: the engine's registered
  ``max_model_len`` is authoritative) and ``vocab_size`` (the bound vLLM checks token ids
  against: ``model_config.get_vocab_size()``).

Loading reads files and builds the tokenizer (tens of milliseconds for a large vocabulary):
call it once, in a worker thread if an event loop is running.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import attrs
import tokenizers

from ..errors import ChatTemplateError, TextInputError

#: The sampling fields vLLM takes from the generation config
#: (``ModelConfig.get_diff_sampling_param``), in its order.
SAMPLING_DEFAULT_FIELDS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)

#: The special-token attributes of transformers' ``special_tokens_map`` (what a chat
#: template is rendered with, besides the messages).
SPECIAL_TOKEN_ATTRIBUTES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _byte_level_chars() -> dict[str, int]:
    """The byte each character of a byte-level vocabulary stands for (GPT-2's
    ``bytes_to_unicode``, inverted: what ``tokenizers``' ByteLevel decoder maps back)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + shifted)] = b
            shifted += 1
    return chars


#: :func:`_byte_level_chars`, made once.
BYTE_LEVEL_CHARS = _byte_level_chars()


class ModelTextError(Exception):
    """A model directory whose text assets cannot be used (the operator's to fix)."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelTextError(f"{path}: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelTextError(f"{path}: expected a JSON object")
    return value


def _token_content(value: object) -> str | None:
    """A special token as tokenizer_config.json spells it: a string, or an AddedToken
    object (``{"content": ..., "__type": "AddedToken"}``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        content = value.get("content")
        if isinstance(content, str):
            return content
    return None


@attrs.frozen
class SamplingDefaults:
    """The model's sampling defaults, as vLLM's ``get_diff_sampling_param`` returns them:
    only what the generation config sets, ``max_new_tokens`` renamed ``max_tokens``."""

    values: dict[str, Any] = attrs.Factory(dict)
    #: The generation config's ``eos_token_id`` (an int or a list), as a list; empty if
    #: it has none.
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SamplingDefaults:
        values: dict[str, Any] = {}
        if any(name in config for name in SAMPLING_DEFAULT_FIELDS):
            for name in SAMPLING_DEFAULT_FIELDS:
                value = config.get(name)
                if value is not None:
                    values["max_tokens" if name == "max_new_tokens" else name] = value
        eos = config.get("eos_token_id")
        if isinstance(eos, bool):
            eos = None
        if isinstance(eos, int):
            ids: tuple[int, ...] = (eos,)
        elif isinstance(eos, list) and all(isinstance(i, int) for i in eos):
            ids = tuple(eos)
        else:
            ids = ()
        return cls(values, ids)


@attrs.define(eq=False)
class ModelText:
    """One model's tokenizer, chat template, special tokens and sampling defaults: built
    once (:meth:`load`), then shared by every request (the tokenizer is safe to use from
    several threads: HF ``tokenizers`` objects are ``Send + Sync``; :meth:`encode` releases
    the GIL)."""

    tokenizer: tokenizers.Tokenizer
    #: tokenizer_config.json as read (empty without one).
    tokenizer_config: dict[str, Any] = attrs.Factory(dict)
    #: The default chat template, and the named ones (tokenizer_config.json's list form).
    chat_template: str | None = None
    named_chat_templates: dict[str, str] = attrs.Factory(dict)
    sampling_defaults: SamplingDefaults = attrs.Factory(SamplingDefaults)
    #: config.json's ``max_position_embeddings`` (information only) and ``vocab_size``.
    max_position_embeddings: int | None = None
    config_vocab_size: int | None = None
    #: Where it was read from (for messages), if anywhere.
    directory: Path | None = None

    @classmethod
    def load(cls, directory: str | Path) -> ModelText:
        """Read ``directory``'s text assets (:class:`ModelTextError` if they are missing or
        broken)."""
        where = Path(directory)
        tokenizer_file = where / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ModelTextError(
                f"{where} has no tokenizer.json (only HF fast tokenizers are supported)"
            )
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # tokenizers raises plain Exception for a bad file
            raise ModelTextError(f"{tokenizer_file}: {exc}") from exc
        tokenizer_config = _read_json(where / "tokenizer_config.json")
        config = _read_json(where / "config.json")
        generation_file = where / "generation_config.json"
        generation = _read_json(generation_file) if generation_file.is_file() else config

        template, named = _chat_templates(tokenizer_config)
        jinja_file = where / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        max_positions = config.get("max_position_embeddings")
        vocab_size = config.get("vocab_size")
        return cls(
            tokenizer,
            tokenizer_config,
            template,
            named,
            SamplingDefaults.from_config(generation),
            max_positions if isinstance(max_positions, int) else None,
            vocab_size if isinstance(vocab_size, int) else None,
            where,
        )

    # -- special tokens ----------------------------------------------------------------

    @cached_property
    def special_tokens_map(self) -> dict[str, Any]:
        """What transformers passes a chat template besides the messages: each special
        token set in tokenizer_config.json, by attribute name."""
        found: dict[str, Any] = {}
        for name in SPECIAL_TOKEN_ATTRIBUTES:
            token = _token_content(self.tokenizer_config.get(name))
            if token is not None:
                found[name] = token
        extra = self.tokenizer_config.get("additional_special_tokens") or self.tokenizer_config.get(
            "extra_special_tokens"
        )
        if isinstance(extra, list):
            tokens = [t for t in map(_token_content, extra) if t is not None]
            if tokens:
                found["additional_special_tokens"] = tokens
        return found

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.tokenizer.token_to_id(token)

    @cached_property
    def eos_token_id(self) -> int | None:
        """The tokenizer's EOS id: what vLLM sets as ``_eos_token_id``
        (``renderer.get_eos_token_id()``)."""
        return self.token_id(self.special_tokens_map.get("eos_token"))

    @cached_property
    def bos_token_id(self) -> int | None:
        return self.token_id(self.special_tokens_map.get("bos_token"))

    @cached_property
    def added_tokens(self) -> dict[int, str]:
        """Every added token (special or not), by id: what the detokenizer keeps apart
        when ``spaces_between_special_tokens`` is false."""
        return {i: t.content for i, t in self.tokenizer.get_added_tokens_decoder().items()}

    @cached_property
    def special_token_ids(self) -> frozenset[int]:
        """The ids ``skip_special_tokens`` leaves out of a decode."""
        added = self.tokenizer.get_added_tokens_decoder()
        return frozenset(i for i, token in added.items() if token.special)

    @cached_property
    def byte_level_decoder(self) -> bool:
        """Whether tokenizer.json's decoder is ByteLevel alone: a decode is then the UTF-8
        (lossy) of the tokens' bytes laid end to end, each token's bytes its own."""
        decoder = self._tokenizer_json.get("decoder") or {}
        return decoder.get("type") == "ByteLevel"

    @cached_property
    def _first_bytes(self) -> dict[int, int | None]:
        return {}

    def first_byte(self, token_id: int) -> int | None:
        """The first byte a byte-level decoder makes of ``token_id`` (None: none, an id
        the tokenizer does not know or an empty token). As ``tokenizers``' ByteLevel
        decoder: a token's characters are the bytes they stand for, or, if one of them
        stands for none, the token's own UTF-8 (which never starts with a continuation
        byte)."""
        known = self._first_bytes
        if token_id in known:
            return known[token_id]
        token = self.tokenizer.id_to_token(token_id)
        first: int | None = None
        if token:
            chars = BYTE_LEVEL_CHARS
            byte = chars.get(token[0])
            if byte is not None and all(c in chars for c in token):
                first = byte
            else:
                first = token.encode()[0]
        if len(known) < 1 << 20:
            known[token_id] = first
        return first

    @cached_property
    def max_token_id(self) -> int:
        """The largest id the tokenizer knows (vLLM's ``tokenizer.max_token_id``)."""
        return max(self.tokenizer.get_vocab(with_added_tokens=True).values())

    @cached_property
    def max_chars_per_token(self) -> int:
        """The longest token's length in characters (vLLM's ``max_chars_per_token``: what
        bounds a prompt's text before it is encoded)."""
        return max([1, *(len(token) for token in self.tokenizer.get_vocab(with_added_tokens=True))])

    @cached_property
    def _tokenizer_json(self) -> dict[str, Any]:
        """The small parts of tokenizer.json read here (its pre-tokenizer and decoder),
        parsed once; the vocabulary and merges are not kept."""
        parsed = json.loads(self.tokenizer.to_str())
        return {part: parsed.get(part) for part in ("pre_tokenizer", "decoder")}

    @cached_property
    def space_marker(self) -> str | None:
        """The Metaspace replacement character of the pre-tokenizer (SentencePiece's
        ``▁``), if any: single-token decodes lose the leading space it stands for."""
        pre = self._tokenizer_json.get("pre_tokenizer") or {}
        candidates = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        for sub in candidates:
            if isinstance(sub, dict) and sub.get("type") == "Metaspace":
                return str(sub.get("replacement", "\u2581"))
        return None

    @cached_property
    def vocab_size(self) -> int:
        """The bound vLLM checks token ids against (``model_config.get_vocab_size()``:
        config.json's ``vocab_size``; the tokenizer's size without a config)."""
        if self.config_vocab_size is not None:
            return self.config_vocab_size
        return self.max_token_id + 1

    # -- tokens and text ---------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """``text``'s token ids (see :meth:`encoding`)."""
        return self.encoding(text, add_special_tokens=add_special_tokens).ids

    def encoding(self, text: str, *, add_special_tokens: bool) -> tokenizers.Encoding:
        """``text`` encoded: ``len()`` is its number of ids, ``.ids`` the list of them,
        which holds the GIL while it is made (docs/benchmarks.md: a prompt refused for its
        length need not make it). ``encode_batch_fast`` (the same ids as
        ``encode``) because it releases the GIL while it works, which ``encode`` does not,
        and skips the character offsets (half the cost): a long prompt encoded in a worker
        thread does not stall the event loop's thread (docs/benchmarks.md,
        tools/bench_tokenize.py)."""
        [encoding] = self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return encoding

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """``token_ids`` as text, as transformers' ``tokenizer.decode`` gives it."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        if self.tokenizer_config.get("clean_up_tokenization_spaces"):
            text = clean_up_tokenization(text)
        return text

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        """400 naming ``param`` if an id is outside the vocabulary (what the engine would
        index a tensor with)."""
        bound = self.vocab_size
        bad = [i for i in token_ids if not 0 <= i < bound]
        if bad:
            raise TextInputError(
                f"token_id(s) {bad[:16]} in {param} contain out-of-vocab token ids. "
                f"Vocabulary size: {bound}",
                param=param,
            )

    def resolve_chat_template(self, given: str | None, *, tools: bool) -> str:
        """The template to render with, as transformers' ``get_chat_template`` picks it: a
        name among the named templates, a request's own template text as it is, else
        ``tool_use`` (with tools) or the default. 400 if the model has none."""
        named = self.named_chat_templates
        if given is not None:
            return named.get(given, given)
        if tools and "tool_use" in named:
            return named["tool_use"]
        if self.chat_template is not None:
            return self.chat_template
        raise ChatTemplateError(
            "As of transformers v4.44, default chat template is no longer allowed, so you "
            "must provide a chat template if the tokenizer does not define one."
        )


def _chat_templates(config: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    value = config.get("chat_template")
    if isinstance(value, str):
        return value, {}
    named: dict[str, str] = {}
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict):
                name, template = entry.get("name"), entry.get("template")
                if isinstance(name, str) and isinstance(template, str):
                    named[name] = template
    return named.get("default"), named


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (for tokenizers configured with
    ``clean_up_tokenization_spaces``): the spaces of old word-level tokenizers removed."""
    return (
        text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
    )

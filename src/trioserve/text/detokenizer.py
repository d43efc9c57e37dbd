"""Incremental detokenization with stop strings: vLLM's ``FastIncrementalDetokenizer``
(``vllm/v1/engine/detokenizer.py``), token for token.

HF ``tokenizers``' ``DecodeStream``, primed with the prompt's ids (so that the first
generated token decodes in context: a leading space, a character split across byte-level
tokens), steps one id at a time and returns text only once it is whole UTF-8: a character
split across tokens is emitted when its last byte arrives, never as a replacement character.
On its "Invalid prefix" error (a tokenizer whose output is not monotonic) the stream starts
over without the prompt, as vLLM's does.

Primed with the whole prompt, the stream's first step decodes the whole prompt twice (19 ms
for 100k tokens here, in the task that reads every request's outputs). With a byte-level
decoder it is primed with a tail of the prompt instead (:func:`decode_primer`), which makes
the same text: such a decode is the lossy UTF-8 of the tokens' bytes end to end, and a
lossy decode splits exactly where the bytes after the split do not begin with a
continuation byte (whatever character the bytes before it left unfinished ends there in
both cases). The stream decodes the prompt and the prompt with the new tokens, and keeps
what the second adds to the first: with the prompt split so, both decodes begin with the
same text, and what is added is the same.

The stream of text a client sees is :meth:`IncrementalDetokenizer.next_text`: what is new,
less the last ``longest stop string - 1`` characters while the request runs (a stop string
still being completed is never sent), everything at the end. A matched stop string cuts the
text and the token ids (tokens after the one that completed it are dropped), and the
request is over: its caller sends the engine one abort and answers ``finish_reason:
"stop"`` with the string as ``stop_reason``.

Not thread-safe; one per request (or per choice). Sans-io: ids in, text out.
"""

from __future__ import annotations

import logging
from bisect import bisect_left

from tokenizers.decoders import DecodeStream

from .assets import ModelText
from .stops import check_stop_strings, hold_back

logger = logging.getLogger(__name__)

#: The start of the error ``DecodeStream.step`` raises on a prefix it cannot extend
#: (tokenizers' ``tokenizer/mod.rs``; vLLM matches the same text).
INVALID_PREFIX = "Invalid prefix encountered"
#: Prompt tokens a decode stream is primed with, at least (when a tail can do: see
#: :func:`decode_primer`).
PRIMER_TOKENS = 8
#: How many tokens further back a split before a character is looked for, before the
#: whole prompt primes the stream.
PRIMER_SEARCH = 32


def decode_primer(
    model: ModelText, prompt_token_ids: list[int], skip_special_tokens: bool
) -> list[int]:
    """The prompt's ids a decode stream is primed with: a tail of at least
    :data:`PRIMER_TOKENS` that decodes the generated tokens exactly as the whole prompt
    would (module docstring), else the whole prompt.

    The tail starts where the bytes after it begin with no continuation byte (the first
    byte of its first token that has any: special tokens count for nothing when skipped).
    A tail whose text ends in a replacement character would not do: the stream keeps no
    prefix then and sends the whole of what it decodes with the first token, and the
    whole prompt's text must be what it sends."""
    length = len(prompt_token_ids)
    if length <= PRIMER_TOKENS or not model.byte_level_decoder:
        return prompt_token_ids
    skipped = model.special_token_ids if skip_special_tokens else frozenset()
    lowest = max(0, length - PRIMER_TOKENS - PRIMER_SEARCH)
    for start in range(length - PRIMER_TOKENS, lowest, -1):
        first = None
        for token_id in prompt_token_ids[start:]:
            if token_id not in skipped:
                first = model.first_byte(token_id)
                if first is not None:
                    break
        if first is not None and not 0x80 <= first <= 0xBF:
            tail = prompt_token_ids[start:]
            text = model.tokenizer.decode(tail, skip_special_tokens=skip_special_tokens)
            return prompt_token_ids if text.endswith("\ufffd") else tail
    return prompt_token_ids


class IncrementalDetokenizer:
    """One request's output: token ids in (:meth:`update`), text out (:meth:`next_text`)."""

    def __init__(
        self,
        model: ModelText,
        prompt_token_ids: list[int],
        *,
        stop: list[str] | None = None,
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = model.tokenizer
        self.stop = list(stop or [])
        self.include_stop_str_in_output = include_stop_str_in_output
        self.min_tokens = min_tokens
        self.skip_special_tokens = skip_special_tokens
        self.stop_buffer_length = hold_back(self.stop, include_stop_str_in_output)
        #: The generated token ids kept (a stop string drops those after it).
        self.token_ids: list[int] = []
        #: All the text so far (cut at a stop string).
        self.output_text = ""
        self._sent = 0
        self._stream = DecodeStream(
            ids=list(decode_primer(model, prompt_token_ids, skip_special_tokens)),
            skip_special_tokens=skip_special_tokens,
        )
        # vLLM: with skip_special_tokens, spaces between special tokens are moot.
        self._spaces_between_special = skip_special_tokens or spaces_between_special_tokens
        self._added: dict[int, str] = {}
        if not self._spaces_between_special:
            self._added = model.added_tokens
            if not self._added:
                self._spaces_between_special = True
        self._last_special = False

    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Take the engine's new ids (``stop_terminated``: it finished on a stop token or
        EOS, the last id). Returns the stop string these ids completed, if any: the
        request is then over, and :attr:`token_ids` and :attr:`output_text` are cut."""
        if not new_token_ids:
            return None
        skipped_stop_token = None
        if stop_terminated and not self.include_stop_str_in_output:
            # The stop token's own text is left out (vLLM's rule).
            skipped_stop_token = new_token_ids[-1]
            new_token_ids = new_token_ids[:-1]
        num_prev = len(self.token_ids)
        first_new = num_prev
        offsets = [len(self.output_text)] if self.stop else None
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            self.output_text += self._decode_next(token_id)
            if offsets is not None:
                offsets.append(len(self.output_text))
        if skipped_stop_token is not None:
            self.token_ids.append(skipped_stop_token)
            if offsets is not None:
                offsets.append(len(self.output_text))

        if offsets is None or len(self.token_ids) <= self.min_tokens:
            return None
        check_from = offsets[max(self.min_tokens - num_prev, 0)]
        found = check_stop_strings(
            self.output_text,
            len(self.output_text) - check_from,
            self.stop,
            self.include_stop_str_in_output,
        )
        if found is None:
            return None
        stop_string, truncate_to = found
        stop_end = len(self.output_text) if truncate_to == -1 else truncate_to
        if not self.include_stop_str_in_output:
            stop_end += len(stop_string)
        # Tokens after the one that completed the stop string (several in one step) go.
        kept = bisect_left(offsets, stop_end, lo=1)
        del self.token_ids[first_new + kept :]
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_string

    def next_text(self, finished: bool) -> str:
        """The text not yet sent: all of it once ``finished``, else less what a stop string
        in progress could still take back."""
        length = len(self.output_text) - (0 if finished else self.stop_buffer_length)
        if self._sent < length:
            text = self.output_text[self._sent : length]
            self._sent = length
            return text
        return ""

    def text(self, finished: bool = True) -> str:
        """All the text so far (non-streaming answers)."""
        buffer = 0 if finished else self.stop_buffer_length
        return self.output_text[: len(self.output_text) - buffer] if buffer else self.output_text

    def _decode_next(self, token_id: int) -> str:
        token = self._step(token_id)
        if not self._spaces_between_special:
            special = self._added.get(token_id)
            if special is not None and self._last_special:
                # Two added tokens in a row: the raw token, without the space the
                # decoder would put between them.
                token = special
            self._last_special = special is not None
        return token or ""

    def _step(self, token_id: int) -> str | None:
        try:
            return self._stream.step(self.tokenizer, token_id)
        except (OverflowError, TypeError):
            logger.warning("invalid token id from the engine: %r", token_id)
            return None
        except Exception as exc:  # tokenizers raises a plain Exception
            if not str(exc).startswith(INVALID_PREFIX):
                raise
            logger.warning("invalid prefix in the decode stream; starting it over")
            self._stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            return self._stream.step(self.tokenizer, token_id)

"""Logprob token strings, spelled as vLLM spells them (``vllm/v1/engine/logprobs.py``,
``tokenizers/detokenizer_utils.py``).

Each id is decoded alone (``decode([id])``, special tokens kept), with the leading spaces a
Metaspace (SentencePiece) tokenizer's decode strips put back; a string that ends in a
replacement character (a byte of a character split across tokens) is decoded again with up
to four of the sampled tokens before it as context, and what the context does not account
for is its text (empty if the character is still incomplete). With
``return_tokens_as_token_ids`` a token is ``token_id:N``.
"""

from __future__ import annotations

from .assets import ModelText

REPLACEMENT = "\N{REPLACEMENT CHARACTER}"
#: Sampled tokens looked back at to complete a split character (vLLM's ``max_context``).
MAX_CONTEXT = 4


def token_id_placeholder(token_id: int) -> str:
    return f"token_id:{token_id}"


def _single(model: ModelText, token_id: int, marker: str | None) -> str:
    text = model.decode([token_id]) or ""
    if marker is None:
        return text
    raw = model.tokenizer.id_to_token(token_id) or ""
    markers = len(raw) - len(raw.lstrip(marker))
    if not markers:
        return text
    missing = markers - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


def _completed(model: ModelText, token_id: int, context: list[int]) -> str:
    """vLLM's ``_correct_decoded_token``."""
    for size in range(1, min(len(context), MAX_CONTEXT) + 1):
        window = context[-size:]
        full = model.decode([*window, token_id])
        if full.endswith(REPLACEMENT):
            continue
        clean_end = len(window)
        for j in range(len(window) - 1, -1, -1):
            if model.decode([window[j]]).endswith(REPLACEMENT):
                clean_end = j
            else:
                break
        prefix = model.decode(window[:clean_end]) if clean_end > 0 else ""
        if full.startswith(prefix):
            return full[len(prefix) :]
        common = 0
        for a, b in zip(prefix, full, strict=False):
            if a != b:
                break
            common += 1
        return full[common:]
    return ""


def token_strings(
    model: ModelText,
    token_ids: list[int],
    context: list[int],
    *,
    as_token_ids: bool = False,
) -> list[str]:
    """The strings of ``token_ids`` (alternatives at one position: the sampled token and
    the top ones), after ``context`` (the sampled tokens before this position, oldest
    first)."""
    if as_token_ids:
        return [token_id_placeholder(i) for i in token_ids]
    marker = model.space_marker
    strings = [_single(model, i, marker) for i in token_ids]
    recent = context[-MAX_CONTEXT:]
    for index, text in enumerate(strings):
        if text.endswith(REPLACEMENT):
            strings[index] = _completed(model, token_ids[index], recent)
    return strings

"""Logprobs in the OpenAI shapes, built as vLLM's serving layer builds them from what
EngineCore sends: per generated position, the sampled token first, then the top ones
(``append_logprobs_for_next_position``), spelled as :mod:`trioserve.text.logprobs` spells
them, then laid out by ``_create_chat_logprobs`` (chat: a list of entries with ``bytes`` and
``top_logprobs``) or ``_create_completion_logprobs`` (completions: parallel lists with
``text_offset``). Logprobs are floored at -9999.0 (JSON has no -inf).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .assets import ModelText
from .logprobs import token_strings

#: vLLM's floor for a logprob in an answer.
MIN_LOGPROB = -9999.0

#: One position: token id -> (logprob, rank, token string), the sampled token first.
Position = dict[int, tuple[float, int, str]]


def position(
    model: ModelText,
    token_ids: list[int],
    logprobs: list[float],
    sampled_rank: int,
    num_logprobs: int,
    context: list[int],
    *,
    as_token_ids: bool = False,
) -> Position:
    """One generated position from EngineCore's row (``token_ids[0]`` is the sampled
    token, then the top ones by rank), after ``context`` (the sampled tokens before)."""
    if num_logprobs == -1:
        num_logprobs = len(logprobs)
    strings = token_strings(model, token_ids, context, as_token_ids=as_token_ids)
    ranks = [sampled_rank, *range(1, num_logprobs + 1)]
    out: Position = {}
    for token_id, logprob, rank, text in zip(token_ids, logprobs, ranks, strings, strict=False):
        out[token_id] = (logprob, rank, text)  # a repeated id keeps its place, takes the value
    return out


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def chat_logprobs(
    token_ids: list[int], positions: list[Position], top_logprobs: int | None
) -> list[dict[str, Any]]:
    """The ``logprobs.content`` entries of chat tokens (``top_logprobs``: how many
    alternatives the request asked for; -1 all)."""
    entries = []
    for token_id, step in zip(token_ids, positions, strict=True):
        logprob, _, text = step[token_id]
        top = [
            {"token": t, "logprob": max(lp, MIN_LOGPROB), "bytes": _bytes(t)}
            for i, (lp, _, t) in enumerate(step.values())
            if top_logprobs == -1 or (top_logprobs is not None and i < top_logprobs)
        ]
        entries.append(
            {
                "token": text,
                "logprob": max(logprob, MIN_LOGPROB),
                "bytes": _bytes(text),
                "top_logprobs": top,
            }
        )
    return entries


def completion_logprobs(
    token_ids: list[int],
    positions: Sequence[Position | str],
    num_logprobs: int,
    initial_offset: int = 0,
) -> dict[str, Any]:
    """The ``logprobs`` of completion tokens: ``text_offset`` from ``initial_offset`` on
    (a stream carries it across deltas: the last offset plus the last token's length). A
    position given as a string is a token with no logprobs, spelled so (an echoed
    prompt's first token: ``null`` logprob and top logprobs)."""
    offsets: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    tops: list[dict[str, float] | None] = []
    last_len = 0
    for token_id, step in zip(token_ids, positions, strict=True):
        if isinstance(step, str):
            tokens.append(step)
            token_logprobs.append(None)
            tops.append(None)
            offsets.append(initial_offset if not offsets else offsets[-1] + last_len)
            last_len = len(step)
            continue
        logprob, _, text = step[token_id]
        tokens.append(text)
        token_logprobs.append(max(logprob, MIN_LOGPROB))
        tops.append(
            {
                t: max(lp, MIN_LOGPROB)
                for i, (lp, _, t) in enumerate(step.values())
                if num_logprobs == -1 or num_logprobs >= i
            }
        )
        offsets.append(initial_offset if not offsets else offsets[-1] + last_len)
        last_len = len(text)
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": tops,
    }


def prompt_logprobs_answer(positions: list[Position]) -> list[dict[str, Any] | None]:
    """A prompt's ``prompt_logprobs`` as vLLM answers them: ``None`` for the first token,
    then per position each token id (as a string) with its logprob (``-inf`` as -9999.0,
    vLLM's ``clamp_prompt_logprobs``), rank and string, the prompt's own token first."""
    out: list[dict[str, Any] | None] = [None]
    for step in positions:
        out.append(
            {
                str(token_id): {
                    "logprob": MIN_LOGPROB if logprob == -math.inf else logprob,
                    "rank": rank,
                    "decoded_token": text,
                }
                for token_id, (logprob, rank, text) in step.items()
            }
        )
    return out


#: One step's log probabilities, row per generated position: the token ids (the sampled
#: one first, then the top ones), their logprobs, and the sampled token's rank.
LogprobRows = tuple[Sequence[Sequence[int]], Sequence[Sequence[float]], Sequence[int]]


class AnswerLogprobs:
    """One answer's logprobs, step by step, in the OpenAI shape of its task, as vLLM's
    serving layer lays them out: the token strings in the context of the answer so far, a
    completion's ``text_offset`` carried across steps."""

    __slots__ = ("as_ids", "chat", "model", "offset", "sampled", "top")

    def __init__(self, model: ModelText, *, chat: bool, top: int, as_token_ids: bool) -> None:
        self.model = model
        self.chat = chat
        self.top = top
        self.as_ids = as_token_ids
        self.sampled: list[int] = []  # token ids so far (logprob strings' context)
        self.offset = 0  # a completion's text_offset (after an echoed prompt, its end)

    def step(self, rows: LogprobRows, kept: int) -> Any:
        """This step's positions, up to ``kept`` tokens of the answer in all (the tokens a
        stop string cut are left out); None when none is left."""
        positions: list[Position] = []
        sampled: list[int] = []
        for row_ids, row_values, rank in zip(*rows, strict=False):
            if len(self.sampled) >= kept:
                break
            step = position(
                self.model, list(row_ids), list(row_values), rank, self.top, self.sampled,
                as_token_ids=self.as_ids,
            )  # fmt: skip
            positions.append(step)
            self.sampled.append(row_ids[0])
            sampled.append(row_ids[0])
        if not positions:
            return None
        if self.chat:
            return chat_logprobs(sampled, positions, self.top)
        out = completion_logprobs(sampled, positions, self.top, self.offset)
        self.offset = out["text_offset"][-1] + len(out["tokens"][-1])
        return out

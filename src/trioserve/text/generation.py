"""One generation of a token-id engine (vLLM's EngineCore) as a client reads it: each
step's token ids in, the text, log probabilities and end out. Sans-io.

What vLLM's output processor does in its API server, and what both of trioserve's vLLM
paths share (the direct link, ``links/vllm.py``, and the shared engine,
``engine_programs/vllm_enginecore.py``), so that they answer the same text:

- the incremental detokenizer (:mod:`~trioserve.text.detokenizer`), streamed text held back
  while a stop string could still be completing;
- a stop string matched here ends the request successfully: :attr:`Delta.stopped` tells
  the caller to abort the engine request (it would generate on), and the answer is
  ``finish_reason: "stop"``;
- the engine's own end (``stop``: a stop token or EOS, left out of the text; ``length``;
  ``abort``; ``repetition``), or :attr:`Delta.error` for its ERROR; vLLM's ``stop_reason``
  with it (the stop string matched here, or the engine's stop token id);
- log probabilities in the OpenAI shape of the task (chat: entries; completions: parallel
  lists with ``text_offset`` carried across deltas), only for the tokens kept.

Finish reasons come in by vLLM's names (``FINISH_REASON_NAMES`` of the codec); the caller
maps the wire's integers.
"""

from __future__ import annotations

from typing import Any

import attrs

from .assets import ModelText
from .logprob_format import AnswerLogprobs, LogprobRows
from .sampling import Sampling

#: The engine finished on a stop token or EOS (whose text is left out).
STOP = "stop"
#: The engine failed the request.
ERROR = "error"


@attrs.define(slots=True)
class Delta:
    """What one step adds to the answer."""

    text: str
    logprobs: Any = None
    #: Set on the last delta: why the generation ended.
    finish_reason: str | None = None
    #: A stop string ended it while the engine still generates: abort the engine request.
    stopped: bool = False
    #: The engine failed the request (no text follows).
    error: bool = False
    #: With ``finish_reason="stop"``: the stop string matched, or the stop token the engine
    #: stopped on (its id), as vLLM's ``stop_reason``; None for the end of sequence.
    stop_reason: str | int | None = None


class GenerationText:
    """One choice of one request: :meth:`step` per engine output, until a delta with a
    ``finish_reason`` (or ``error``); nothing after it."""

    __slots__ = ("answer_logprobs", "detokenizer", "logprobs", "prompt_tokens")

    def __init__(
        self, model: ModelText, task: str, prompt_token_ids: list[int], sampling: Sampling
    ) -> None:
        self.prompt_tokens = len(prompt_token_ids)
        self.detokenizer = sampling.detokenizer(model, prompt_token_ids)
        params = sampling.params
        self.logprobs = params.get("logprobs") is not None
        self.answer_logprobs = AnswerLogprobs(
            model,
            chat=task == "chat",
            top=int(params.get("logprobs") or 0),
            as_token_ids=sampling.tokens_as_token_ids,
        )

    @property
    def completion_tokens(self) -> int:
        """Generated tokens kept (a stop string drops those after it), as vLLM counts
        them in ``usage``."""
        return self.detokenizer.num_output_tokens()

    def step(
        self,
        new_token_ids: list[int],
        finish_reason: str | None,
        rows: LogprobRows | None,
        stop_reason: str | int | None = None,
    ) -> Delta | None:
        """One engine output: its new ids, the engine's finish reason (None while it
        runs), its logprob rows (None when none were asked for) and its stop reason (the
        stop token's id). None: nothing to send yet (text held back, or a character not
        yet whole)."""
        detok = self.detokenizer
        stop_string = detok.update(new_token_ids, finish_reason == STOP)
        logprobs = None
        if self.logprobs and rows is not None:
            logprobs = self.answer_logprobs.step(rows, len(detok.token_ids))
        if stop_string is not None and finish_reason is None:
            return Delta(
                detok.next_text(True), logprobs, STOP, stopped=True, stop_reason=stop_string
            )
        if finish_reason is None:
            text = detok.next_text(False)
            return Delta(text, logprobs) if text or logprobs else None
        if finish_reason == ERROR:
            return Delta("", None, ERROR, error=True)
        if stop_string is not None:
            finish_reason, stop_reason = STOP, stop_string
        return Delta(detok.next_text(True), logprobs, finish_reason, stop_reason=stop_reason)


__all__ = ["ERROR", "STOP", "Delta", "GenerationText", "LogprobRows"]

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
  lists with ``text_offset`` carried across deltas), only for the tokens kept;
- the step's kept token ids, when the request returns them (``return_token_ids``);
- ``echo`` without generation (a completion's ``max_tokens: 0``): the one token the engine
  generates is neither shown nor given logprobs, as vLLM's serving layer has it.

- what the request asked about its prompt (``echo``: the echoed text and, for a completion,
  its logprobs; ``return_token_ids``: the prompt's ids; ``prompt_logprobs``), with the
  first delta, as vLLM's serving layer sends them with the first output that has tokens:
  by then the prompt's logprobs, which come with the prefill's chunks
  (:meth:`GenerationText.add_prompt_rows`), are all in.

Finish reasons come in by vLLM's names (``FINISH_REASON_NAMES`` of the codec); the caller
maps the wire's integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .assets import ModelText
from .logprob_format import (
    AnswerLogprobs,
    LogprobRows,
    Position,
    completion_logprobs,
    position,
    prompt_logprobs_answer,
)
from .logprobs import token_id_placeholder
from .requests import Prepared
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
    #: The step's token ids the answer keeps (a stop string drops those after it), when
    #: the request returns them (``return_token_ids``); else None.
    token_ids: list[int] | None = None
    #: On the first delta, when the request asked: the prompt's token ids
    #: (``return_token_ids``; a completion's ``echo`` too, which vLLM streams with them),
    #: and its logprobs as vLLM answers them (``prompt_logprobs``).
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[Any] | None = None


class GenerationText:
    """One choice of one request: :meth:`step` per engine output, until a delta with a
    ``finish_reason`` (or ``error``); nothing after it."""

    __slots__ = (
        "answer_logprobs",
        "begun",
        "detokenizer",
        "echo_only",
        "logprobs",
        "prompt",
        "prompt_tokens",
        "return_token_ids",
    )

    def __init__(self, model: ModelText, task: str, ready: Prepared) -> None:
        prompt_token_ids, sampling = ready.prompt.token_ids, ready.sampling
        self.prompt_tokens = len(prompt_token_ids)
        #: Whether a step has had token ids: the answer has begun.
        self.begun = False
        self.detokenizer = sampling.detokenizer(model, prompt_token_ids)
        params = sampling.params
        self.echo_only = sampling.echo_only
        # (Echo without generation: the one token generated has no logprobs shown.)
        self.logprobs = params.get("logprobs") is not None and not sampling.echo_only
        self.return_token_ids = sampling.return_token_ids
        self.answer_logprobs = AnswerLogprobs(
            model,
            chat=task == "chat",
            top=int(params.get("logprobs") or 0),
            as_token_ids=sampling.tokens_as_token_ids,
        )
        #: What the first delta adds about the prompt, until it has left (None: nothing
        #: was asked).
        self.prompt: _PromptDetails | None = None
        asked = params.get("prompt_logprobs") is not None or sampling.return_token_ids
        if asked or ready.echo is not None:
            self.prompt = _PromptDetails(model, task, prompt_token_ids, ready.echo, sampling)

    @property
    def completion_tokens(self) -> int:
        """Generated tokens kept (a stop string drops those after it), as vLLM counts
        them in ``usage``."""
        return self.detokenizer.num_output_tokens()

    def add_prompt_rows(self, rows: LogprobRows) -> None:
        """One prefill chunk's prompt logprobs (per prompt position after the first: the
        prompt's token and the top ones, their logprobs, the prompt token's rank), before
        the :meth:`step` of the same engine output."""
        if self.prompt is not None:
            self.prompt.rows += zip(*rows, strict=False)

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
        yet whole, and no logprobs or kept ids), except at the first step with token ids,
        which answers a delta even without text: the answer has begun, and the client is
        told so when the engine's first token comes (vLLM's server sends its first chunk
        then). That first delta (or the last, if the engine ended first) carries what the
        request asked about its prompt."""
        details = self.prompt
        if details is None or not (new_token_ids or finish_reason is not None):
            return self._step(new_token_ids, finish_reason, rows, stop_reason)
        self.prompt = None
        head = details.head(self.answer_logprobs)  # (before the step's logprobs: offsets)
        delta = self._step(new_token_ids, finish_reason, rows, stop_reason)
        if delta is None or delta.error:  # (None cannot be: the first ids open the answer)
            return delta
        delta.text = head.text + delta.text
        delta.logprobs = _joined(head.logprobs, delta.logprobs)
        delta.prompt_token_ids = head.prompt_token_ids
        delta.prompt_logprobs = head.prompt_logprobs
        return delta

    def _step(
        self,
        new_token_ids: list[int],
        finish_reason: str | None,
        rows: LogprobRows | None,
        stop_reason: str | int | None,
    ) -> Delta | None:
        opens = bool(new_token_ids) and not self.begun
        if opens:
            self.begun = True
        detok = self.detokenizer
        before = len(detok.token_ids)
        stop_string = detok.update(new_token_ids, finish_reason == STOP)
        kept = detok.token_ids[before:] if self.return_token_ids else None
        logprobs = None
        if self.logprobs and rows is not None:
            logprobs = self.answer_logprobs.step(rows, len(detok.token_ids))
        # A stop string matched while the engine generates on: the frontend's own end.
        stopped = stop_string is not None and finish_reason is None
        if finish_reason is None and not stopped:
            text = "" if self.echo_only else detok.next_text(False)
            if text or logprobs or kept or opens:
                return Delta(text, logprobs, token_ids=kept)
            return None
        if finish_reason == ERROR:
            return Delta("", None, ERROR, error=True)
        if stop_string is not None:
            finish_reason, stop_reason = STOP, stop_string
        text = detok.next_text(True)
        if self.echo_only:
            text = ""  # the one token generated is not shown
        return Delta(
            text, logprobs, finish_reason, stopped, stop_reason=stop_reason, token_ids=kept
        )


class _PromptDetails:
    """What a request asked about its prompt, gathered until its first delta: the prompt
    logprobs' rows of the prefill, then :meth:`head`."""

    __slots__ = (
        "as_ids",
        "chat",
        "echo",
        "logprobs",
        "model",
        "num",
        "prompt_ids",
        "prompt_ids_shown",
        "rows",
    )

    def __init__(
        self,
        model: ModelText,
        task: str,
        prompt_ids: list[int],
        echo: str | None,
        sampling: Sampling,
    ) -> None:
        self.model = model
        self.chat = task == "chat"
        self.prompt_ids = prompt_ids
        self.echo = echo  # None: no echo
        params = sampling.params
        # (An echo's logprobs are shown even without generation, unlike the answer's.)
        self.logprobs = params.get("logprobs") is not None
        self.num: int | None = params.get("prompt_logprobs")
        self.as_ids = sampling.tokens_as_token_ids
        # A completion's echo carries them unasked: vLLM's echo branch streams them (a
        # JSON answer shows them only if asked: the writers' StreamFormat.returns_token_ids).
        self.prompt_ids_shown = sampling.return_token_ids or (echo is not None and not self.chat)
        #: Per prompt position after the first: its token and the top ones, their
        #: logprobs, the prompt token's rank.
        self.rows: list[tuple[Sequence[int], Sequence[float], int]] = []

    def _positions(self, as_token_ids: bool) -> list[Position]:
        num = self.num or 0
        positions: list[Position] = []
        context: list[int] = []  # the prompt's tokens with logprobs (not the first)
        for row_ids, row_values, rank in self.rows:
            ids = list(row_ids)
            positions.append(
                position(
                    self.model, ids, list(row_values), rank, num, context, as_token_ids=as_token_ids
                )
            )
            context.append(ids[0])
        return positions

    def head(self, answer: AnswerLogprobs) -> _Head:
        """What the first delta adds: the echo and its logprobs (a completion's prompt
        tokens, the first with none: vLLM's ``_create_completion_logprobs``; the answer's
        ``text_offset`` then counts on from the echo's end), the prompt's ids and its
        logprobs."""
        positions = self._positions(False)
        prompt_logprobs = None
        if self.num is not None:
            prompt_logprobs = prompt_logprobs_answer(positions)
        text, logprobs = self.echo or "", None
        if self.echo is not None and self.logprobs and not self.chat and self.prompt_ids:
            first = self.prompt_ids[0]
            spelled = token_id_placeholder(first) if self.as_ids else self.model.decode([first])
            if self.as_ids:
                positions = self._positions(True)
            logprobs = completion_logprobs(self.prompt_ids, [spelled, *positions], answer.top, 0)
            answer.offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        prompt_ids = self.prompt_ids if self.prompt_ids_shown else None
        return _Head(text, logprobs, prompt_ids, prompt_logprobs)


@attrs.frozen
class _Head:
    """What a request's first delta adds about its prompt (:meth:`_PromptDetails.head`)."""

    text: str
    logprobs: Any
    prompt_token_ids: list[int] | None
    prompt_logprobs: list[Any] | None


def _joined(first: Any, then: Any) -> Any:
    """Two runs of logprobs of one answer as one (chat's lists, completions' maps of
    parallel lists)."""
    if first is None or then is None:
        return then if first is None else first
    if isinstance(first, dict):
        return {key: first[key] + then[key] for key in first}
    return first + then


__all__ = ["ERROR", "STOP", "Delta", "GenerationText", "LogprobRows"]

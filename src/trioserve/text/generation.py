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

What a request asked about its prompt (the echoed text, the prompt's token ids and
logprobs) comes from the engine's prefill, not from these steps: the direct link adds it
to its first output.

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
    #: The step's token ids the answer keeps (a stop string drops those after it), when
    #: the request returns them (``return_token_ids``); else None.
    token_ids: list[int] | None = None


class GenerationText:
    """One choice of one request: :meth:`step` per engine output, until a delta with a
    ``finish_reason`` (or ``error``); nothing after it."""

    __slots__ = (
        "answer_logprobs",
        "begun",
        "detokenizer",
        "echo_only",
        "logprobs",
        "prompt_tokens",
        "return_token_ids",
    )

    def __init__(
        self, model: ModelText, task: str, prompt_token_ids: list[int], sampling: Sampling
    ) -> None:
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
        yet whole, and no logprobs or kept ids), except at the first step with token ids,
        which answers a delta even without text: the answer has begun, and the client is
        told so when the engine's first token comes (vLLM's server sends its first chunk
        then)."""
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


__all__ = ["ERROR", "STOP", "Delta", "GenerationText", "LogprobRows"]

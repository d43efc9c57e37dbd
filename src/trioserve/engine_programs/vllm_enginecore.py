"""The shared vLLM engine on trioserve's own EngineCore client: ``trioserve engine vllm
MODEL`` (the default backend, ``--backend enginecore``).

One process serves many frontends over trioserve's protocol (the SDK's trio shell) and is
the one client of a vLLM EngineCore it starts headless as a child (the process tree: this
engine, vLLM's launcher, EngineCore, its worker; ``enginecore/launcher.py``). A frontend
that rolls leaves the model loaded; a frontend gone silent has its requests aborted here
(the SDK). Each submit goes through the same text pipeline as the direct path
(``trioserve run --vllm``): so the same prompt ids, the same sampling parameters and their
400s, the same detokenized text, stop strings and logprobs, and the same answers to what a
request asks about its prompt (``echo``, ``prompt_logprobs``, ``return_token_ids``: on the
outputs' ``token_ids``, ``prompt_token_ids`` and ``prompt_logprobs``).

- **Prepare** (in a worker thread: a long prompt must not stall other streams): the chat
  template rendered, the prompt tokenized, the parameters lowered and validated as vLLM
  validates them (:func:`~trioserve.text.requests.prepare`). A refusal is a 400 naming
  the parameter, before anything reaches the engine (an invalid ADD wedges EngineCore).
- **Generate**: one ADD; each step's token ids become text (:class:`~trioserve.text.
  generation.GenerationText`); a stop string matched here sends one ABORT and ends the
  request with ``finish_reason: "stop"`` and the string as ``stop_reason``; cancelling
  ``generate`` (the frontend's abort, an orphaned frontend, the drain's end) sends one
  ABORT unless the engine had finished.
- **Figures**: the scheduler's own figures of every step (running, waiting, KV-cache
  usage) answer pings (routing) and are served, with the requests' ends by finish reason,
  the tokens and vLLM's latency histograms, on ``--metrics-port`` under vLLM's own metric
  names (``vllm_figures.py``).
- **Death**: when the client loses EngineCore (its process exits, its sockets close, a
  heartbeat goes unanswered) every request in flight ends with a 503 ``engine_unavailable``
  error item, and after :data:`LOST_GRACE` seconds (for those items to leave) the process
  exits with status 1, so frontends see the engine gone.

What the EngineCore client does not serve (multimodal inputs, LoRA, non-HF tokenizers, a
server-side chat template) is refused with a clear error naming ``--backend asyncllm``,
which serves them through vLLM's ``AsyncLLM`` (``vllm_asyncllm.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

import trio

from ..enginecore import codec
from ..enginecore.client import EngineCoreClient
from ..enginecore.events import RequestTimes
from ..enginecore.launcher import open_child_engine
from ..enginecore.server_options import (
    model_directory,
    refuse_unserved_options,
    vllm_server_options,
)
from ..errors import (
    CommandError,
    EngineLostError,
    EngineOverloadedError,
    InputError,
    RequestError,
    TextInputError,
)
from ..protocol import ModelCard, Submit, Usage
from ..sdk.core import EngineLoad, Output
from ..sdk.trio_shell import serve_engine
from ..text.assets import ModelText, ModelTextError
from ..text.background import background
from ..text.engine_options import engine_limits
from ..text.generation import GenerationText
from ..text.registry import ServedText
from ..text.requests import prepare, small_enough_inline, unserved_field
from ..transport.keys import CurveServerKeys
from .process import ProcessOptions, exit_with_parent_trio, security
from .vllm_figures import EngineFigures, serve_metrics

log = logging.getLogger(__name__)

#: Seconds the requests of a lost EngineCore have for their error items to leave before
#: this process exits.
LOST_GRACE = 1.0
#: Engine outputs one request may have waiting for its generator (which takes them as
#: they come, in this process: only a starved event loop gets near it).
OUTPUT_BACKLOG = 4096
#: Random bytes after the frontend's request id in vLLM's: two frontends may use one id.
SUFFIX_BYTES = 6
#: Where ``--backend asyncllm`` is the answer.
FALLBACK = "`trioserve engine vllm --backend asyncllm` serves it (docs/engines.md)"


def check_options(vllm_args: Sequence[str]) -> argparse.Namespace:
    """The server options this process reads; :class:`CommandError` (status 2) for one it
    does not serve."""
    refuse_unserved_options(vllm_args, "by the EngineCore backend", FALLBACK)
    options = vllm_server_options(vllm_args)
    if options.tokenizer_mode not in ("auto", "hf"):
        raise CommandError(
            f"--tokenizer-mode {options.tokenizer_mode} is not served by the EngineCore "
            f"backend (its tokenizer is HF's tokenizer.json); {FALLBACK}",
            2,
        )
    return options


def refuse_unserved(params: dict[str, Any]) -> None:
    """A 400 naming a request field this backend does not serve (rather than an answer
    without it)."""
    unserved = unserved_field(params)
    if unserved is not None:
        name, what = unserved
        raise RequestError(
            400,
            f"{what} ({name!r}) are not served by this engine; {FALLBACK}",
            InputError.default_code,
            param=name,
        )


class _Outputs:
    """One request's outputs as the client hands them over (an
    :class:`~trioserve.enginecore.client.OutputSink`), for its generator to take."""

    __slots__ = ("arrived", "ended", "failure", "pending")

    def __init__(self) -> None:
        #: What has come and not been taken: each output with its step's timestamp.
        self.pending: list[tuple[codec.EngineCoreOutput, float]] = []
        self.arrived = trio.Event()
        #: The engine has ended the request (its final output came, or it was lost): no
        #: abort is owed.
        self.ended = False
        self.failure: RequestError | None = None

    def output(self, output: codec.EngineCoreOutput, timestamp: float = 0.0) -> None:
        if output.finish_reason is not None:
            self.ended = True
        if len(self.pending) >= OUTPUT_BACKLOG and self.failure is None:
            self.failure = RequestError(503, "the engine's outputs backed up", "engine_error")
        self.pending.append((output, timestamp))
        self.arrived.set()

    def lost(self, reason: str) -> None:
        self.ended = True
        self.failure = RequestError(
            503, f"vLLM's EngineCore is lost: {reason}", "engine_unavailable"
        )
        self.arrived.set()

    async def take(self) -> list[tuple[codec.EngineCoreOutput, float]]:
        """What has arrived (waiting for something), each output with its step's
        timestamp; raises the request's failure."""
        if not self.pending and self.failure is None:
            await self.arrived.wait()
        if self.failure is not None:
            raise self.failure
        self.arrived = trio.Event()
        taken, self.pending = self.pending, []
        return taken


class EngineCoreBackend:
    """The SDK backend over one connected :class:`EngineCoreClient`. Owns nothing it must
    close: the client is the caller's (:func:`serve`)."""

    capabilities = ["chat", "completion"]

    def __init__(
        self,
        client: EngineCoreClient,
        served: ServedText,
        names: Sequence[str],
        figures: EngineFigures,
    ) -> None:
        self.client = client
        self.served = served
        self.served_names = list(names)
        self.engine_id = f"vllm-{self.served_names[0]}"
        self.models = [ModelCard(name, owned_by="vllm") for name in self.served_names]
        self.figures = figures
        client.on_stats = figures.on_stats

    def load(self) -> EngineLoad:
        return self.figures.load()

    async def generate(self, request: Submit) -> AsyncIterator[Output]:
        params = request.params
        refuse_unserved(params)
        try:
            preparing = partial(
                prepare,
                self.served,
                request.task,
                dict(request.inputs),
                params,
                stream=bool(params.get("stream", False)),
            )
            if small_enough_inline(request.task, request.inputs, params):
                prepared = preparing()  # cheaper than the hop to a thread
            else:
                # A tokenization runs to its end, alone, if the request is cancelled.
                prepared = await trio.to_thread.run_sync(
                    background(preparing), abandon_on_cancel=True
                )
        except TextInputError as exc:  # the direct path's 400: its message, code and param
            raise RequestError(400, exc.message, exc.code, param=exc.param) from None
        prompt, sampling = prepared.prompt, prepared.sampling
        try:
            sampling_params = codec.sampling_params(sampling.params)
        except ValueError as exc:  # a type the lowering let through: refused, not sent
            raise RequestError(400, str(exc), InputError.default_code) from None
        engine_id = f"{request.request_id}-{os.urandom(SUFFIX_BYTES).hex()}"
        outputs = _Outputs()
        arrival = time.time()
        try:
            self.client.add(
                codec.EngineCoreRequest(
                    request_id=engine_id,
                    prompt_token_ids=prompt.token_ids,
                    mm_features=None,
                    sampling_params=sampling_params,
                    pooling_params=None,
                    arrival_time=arrival,
                    lora_request=None,
                    cache_salt=params.get("cache_salt"),
                    data_parallel_rank=None,
                    priority=sampling.priority,
                    trace_headers=request.trace_context or None,
                ),
                outputs,
            )
        except EngineLostError as exc:
            raise RequestError(503, str(exc), "engine_unavailable") from None
        except EngineOverloadedError as exc:
            raise RequestError(503, str(exc), "engine_overloaded") from None
        text = GenerationText(self.served.text, request.task, prepared)
        figures = self.figures
        first = True
        times = RequestTimes()
        generated = 0
        try:
            while True:
                for output, timestamp in await outputs.take():
                    if output.events:
                        times.update(output.events)
                    figures.output(times, timestamp)
                    if first and output.new_token_ids:
                        first = False
                        figures.prompt_tokens += text.prompt_tokens
                        figures.time_to_first_token.observe(time.time() - arrival)
                    generated += len(output.new_token_ids)
                    figures.generation_tokens += len(output.new_token_ids)
                    if output.new_prompt_logprobs_tensors is not None:
                        text.add_prompt_rows(output.new_prompt_logprobs_tensors.rows())
                    reason = output.finish_reason
                    lists = output.new_logprobs
                    delta = text.step(
                        output.new_token_ids,
                        None if reason is None else codec.finish_reason_name(reason),
                        None if lists is None else lists.rows(),
                        output.stop_reason,
                    )
                    if delta is None:
                        continue
                    if delta.error:
                        figures.ended("error")
                        raise RequestError(500, "vLLM's engine failed the request")
                    if delta.finish_reason is None:
                        yield Output(
                            data=delta.text or None,
                            logprobs=delta.logprobs,
                            token_ids=delta.token_ids,
                            prompt_token_ids=delta.prompt_token_ids,
                            prompt_logprobs=delta.prompt_logprobs,
                        )
                        continue
                    if delta.stopped:  # the engine generates on: this is its one abort
                        outputs.ended = True
                        self.client.abort([engine_id])
                    figures.completed(delta.finish_reason, times, arrival, generated)
                    queue_time = times.queue_time
                    yield Output(
                        data=delta.text or None,
                        usage=Usage(text.prompt_tokens, text.completion_tokens),
                        finish_reason=delta.finish_reason,
                        logprobs=delta.logprobs,
                        stop_reason=delta.stop_reason,
                        queue_time=queue_time,
                        token_ids=delta.token_ids,
                        prompt_token_ids=delta.prompt_token_ids,
                        prompt_logprobs=delta.prompt_logprobs,
                    )
                    return
        finally:
            if not outputs.ended:  # cancelled (aborted, orphaned, cut off) or failed
                outputs.ended = True
                figures.ended("abort")
                self.client.abort([engine_id])


async def serve(
    model: str,
    vllm_args: Sequence[str],
    process: ProcessOptions,
    curve: CurveServerKeys | None,
    *,
    metrics_port: int | None,
    load_timeout: float,
) -> int:
    """Start EngineCore for ``model``, serve it to frontends on ``process.bind`` until a
    signal has drained it or the parent is gone (0), or EngineCore is lost (1)."""
    options = check_options(vllm_args)
    status = 0
    parent = process.parent()
    with trio.CancelScope() as loading:
        async with trio.open_nursery() as nursery:
            # While the model loads, a signal (or the parent's end) stops the start; once
            # it is loaded the signals are the SDK's (its drain). Only one receiver may
            # own them at a time: the watch has ended before serving begins.
            watching = trio.CancelScope()
            watched = trio.Event()

            async def watch() -> None:
                try:
                    with watching:
                        async with trio.open_nursery() as watchers:
                            watchers.start_soon(_cancel_on_signals, loading)
                            if parent is not None:
                                watchers.start_soon(exit_with_parent_trio, parent, loading)
                finally:
                    watched.set()

            nursery.start_soon(watch)
            log.info("loading %s with vLLM (EngineCore, headless)", model)
            try:
                async with open_child_engine(model, vllm_args, load_timeout=load_timeout) as child:
                    watching.cancel()
                    await watched.wait()
                    status = await _serve_on(
                        child.client, model, options, process, curve, metrics_port=metrics_port
                    )
            except EngineLostError as exc:
                if not status:  # lost while it loaded (once serving, it was said then)
                    log.error("%s; stopping this engine", exc)
                status = 1
            finally:
                watching.cancel()
    log.log(logging.ERROR if status else logging.INFO, "vLLM engine stopped")
    return status


async def _serve_on(
    client: EngineCoreClient,
    model: str,
    options: Any,
    process: ProcessOptions,
    curve: CurveServerKeys | None,
    *,
    metrics_port: int | None,
) -> int:
    directory = model_directory(model, options.tokenizer, otherwise=FALLBACK)
    try:
        text = await trio.to_thread.run_sync(ModelText.load, directory)
    except ModelTextError as exc:
        raise CommandError(f"cannot read {directory}'s tokenizer ({exc}); {FALLBACK}") from None
    limits = engine_limits(options, client.ready.max_model_len)
    names = options.served_model_name or [model]
    figures = EngineFigures(names[0])
    backend = EngineCoreBackend(client, ServedText(text, limits), names, figures)
    status = 0
    parent = process.parent()
    # Shielded from the client's loss (which cancels the body it yields to), so that the
    # requests in flight can tell their frontends why; stopped LOST_GRACE seconds later.
    with trio.CancelScope(shield=True):
        async with trio.open_nursery() as nursery:

            async def serve_frontends(task_status: trio.TaskStatus[Any]) -> None:
                await serve_engine(
                    backend,
                    process.bind,
                    frontend_timeout=process.frontend_timeout,
                    log_aborts=process.log_aborts,
                    curve=curve,
                    # SIGTERM or SIGINT drains; serving returns once the drain is over.
                    drain_on_signals=True,
                    grace_period=process.grace_period,
                    task_status=task_status,
                )
                nursery.cancel_scope.cancel()

            async def stop_when_lost() -> None:
                await client.lost.wait()
                nonlocal status
                status = 1
                log.error(
                    "vLLM's EngineCore is dead; stopping this engine (its frontends see it gone)"
                )
                await trio.sleep(LOST_GRACE)
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_when_lost)
            engine = await nursery.start(serve_frontends)
            if metrics_port is not None:
                serve_metrics(metrics_port, figures, engine.stats)
            if parent is not None:
                nursery.start_soon(exit_with_parent_trio, parent, nursery.cancel_scope)
            log.info(
                "vLLM engine serving %s on %s (%s; EngineCore %s)",
                ", ".join(names),
                process.bind,
                security(curve),
                client.ready.vllm_version,
            )
    return status


async def _cancel_on_signals(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("%s while loading: stopping", signal.Signals(signum).name)
            scope.cancel()
            return


__all__ = ["EngineCoreBackend", "serve"]

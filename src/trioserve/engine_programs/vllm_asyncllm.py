"""The shared vLLM engine over vLLM's ``AsyncLLM``: ``trioserve engine vllm MODEL
--backend asyncllm``, the fallback for what the EngineCore backend (``vllm_enginecore.py``,
the default) does not serve yet: multimodal inputs, LoRA adapters, non-HF tokenizers
(Mistral's), a server-side chat template.

The process is the asyncio shell of the SDK around one :class:`VllmBackend` (it imports
``vllm`` itself); vLLM starts its EngineCore (the scheduler and the model) as a child
process of its own, as ``vllm serve`` does.

What is vLLM's and what is ours:

- A submit becomes vLLM's own request object (``ChatCompletionRequest`` or
  ``CompletionRequest``, built from the messages or prompt and the params the frontend
  passed on), rendered by vLLM's own ``OnlineRenderer`` (chat template, tokenizer) and
  turned into ``SamplingParams`` by vLLM's own ``to_sampling_params``. So the prompt, the
  parameter mapping, the defaults from the model's generation config and every validation
  message are those of ``vllm serve``. A request vLLM refuses is a 400 naming its reason.
- Outputs are vLLM's deltas (``RequestOutputKind.DELTA``): text detokenized by vLLM
  (a character split across byte-level tokens arrives whole), ``finish_reason`` and
  ``stop_reason`` (the stop string or stop token) as vLLM says them, and usage counted
  from the token ids.
- Cancelling ``generate`` (the frontend's abort, an orphaned frontend) cancels vLLM's
  ``generate``, which aborts the request in vLLM's scheduler: one abort, seen there.
- Load: a stat logger of ours receives vLLM's scheduler figures (running, waiting,
  KV-cache usage) after every engine step; pongs carry them to the frontends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any, NoReturn

import attrs

from ..errors import CommandError
from ..protocol import ModelCard, Submit, Usage
from ..sdk.asyncio_shell import AsyncioEngine, serve_engine_asyncio
from ..sdk.core import EngineLoad, Output, RequestError, Stats
from ..transport.keys import CurveServerKeys
from .process import (
    ProcessOptions,
    bind_error,
    cancel_on_signals,
    exit_with_parent_asyncio,
    security,
)

log = logging.getLogger(__name__)

#: vLLM's request id for one submit: the frontend's id plus a random suffix, since two
#: frontends may use the same request id.
_SUFFIX_BYTES = 6


#: Request fields vLLM would act on whose results this backend does not lay out as vLLM's
#: serving layer answers them (the EngineCore backend does, from the text layer): refused
#: with a 400 naming them, rather than silently dropped.
UNRELAYED = ("prompt_logprobs", "echo", "return_token_ids")


class SchedulerFigures:
    """vLLM's own figures of its scheduler, as its last engine step reported them.

    Filled by :class:`_FiguresLogger`, which vLLM calls after every step (a stat logger is
    vLLM's documented way to receive them)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0


def _figures_logger_factory(figures: SchedulerFigures) -> Any:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _FiguresLogger(StatLoggerBase):  # type: ignore[misc]  # (vLLM is untyped here)
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                figures.running = scheduler_stats.num_running_reqs
                figures.waiting = (
                    scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                )
                figures.kv_cache_usage = scheduler_stats.kv_cache_usage

        def log_engine_initialized(self) -> None:
            pass

    return _FiguresLogger


class VllmBackend:
    """A trioserve backend over one started ``AsyncLLM``.

    Owns nothing it must close: the caller owns the ``AsyncLLM`` (see :func:`_serve`).
    """

    capabilities = ["chat", "completion"]

    def __init__(
        self,
        engine: Any,
        renderer: Any,
        served_names: Sequence[str],
        figures: SchedulerFigures,
        servings: tuple[Any, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        #: vLLM's own chat and completion serving objects, whose methods format log
        #: probabilities exactly as vllm serve does (None: logprobs are refused).
        self.servings = servings
        self.served_names = list(served_names)
        self.engine_id = f"vllm-{self.served_names[0]}"
        self.models = [ModelCard(name, owned_by="vllm") for name in self.served_names]
        self.figures = figures
        model_config = engine.model_config
        self.max_model_len: int = model_config.max_model_len
        self.default_sampling_params: dict[str, Any] = model_config.get_diff_sampling_param()
        # As vLLM's serving classes compute it (OpenAIServingChat.__init__).
        if model_config.generation_config not in ("auto", "vllm"):
            self.override_max_tokens = self.default_sampling_params.get("max_tokens")
        else:
            override = getattr(model_config, "override_generation_config", {}) or {}
            self.override_max_tokens = override.get("max_new_tokens")

    def load(self) -> EngineLoad:
        figures = self.figures
        return EngineLoad(figures.running, figures.waiting, figures.kv_cache_usage)

    async def generate(self, request: Submit) -> AsyncIterator[Output]:
        from vllm.sampling_params import RequestOutputKind

        vllm_request, engine_input = await self._render(request)
        sampling_params = self._sampling_params(vllm_request, engine_input)
        sampling_params.output_kind = RequestOutputKind.DELTA
        # n > 1 comes as n submits, each one sequence, seeded by the frontend (validated
        # above with n as asked: vLLM refuses greedy n > 1, as vllm serve does).
        sampling_params.n = 1
        request_id = f"{request.request_id}-{os.urandom(_SUFFIX_BYTES).hex()}"
        logprobs = self._logprobs_formatter(request.task, vllm_request)
        prompt_tokens = 0
        completion_tokens = 0
        try:
            # A traced request's context (Submit.trace_context): vLLM's spans of it join
            # the frontend's trace, when vLLM traces (its own --otlp-traces-endpoint).
            traced = {"trace_headers": request.trace_context} if request.trace_context else {}
            stream = self.engine.generate(engine_input, sampling_params, request_id, **traced)
            async for result in stream:
                if result.prompt_token_ids is not None:
                    prompt_tokens = len(result.prompt_token_ids)
                completion = result.outputs[0]
                completion_tokens += len(completion.token_ids)
                delta_logprobs = None
                if logprobs is not None and completion.token_ids:
                    delta_logprobs = logprobs(completion.token_ids, completion.logprobs)
                if result.finished:
                    yield Output(
                        data=completion.text or None,
                        usage=Usage(prompt_tokens, completion_tokens),
                        finish_reason=completion.finish_reason or "stop",
                        logprobs=delta_logprobs,
                        stop_reason=completion.stop_reason,
                    )
                    return
                if completion.text or delta_logprobs:
                    yield Output(data=completion.text or None, logprobs=delta_logprobs)
        except _client_errors() as exc:
            raise _client_error(exc) from exc
        except Exception as exc:
            raise _vllm_error(exc) from exc

    def _logprobs_formatter(self, task: str, vllm_request: Any) -> Any:
        """A function of one delta's token ids and vLLM's logprobs for them that returns
        them as vllm serve puts them in a chunk (its own formatting methods), or None
        when the request asked for none. Completions' text offsets run on across deltas."""
        # chat: a boolean; completions: how many alternatives, 0 being a request too.
        wanted = vllm_request.logprobs if task == "chat" else vllm_request.logprobs is not None
        if not wanted:
            return None
        if self.servings is None:
            raise RequestError(
                400, "logprobs are not served by this engine", "invalid_request_error"
            )
        chat, completions = self.servings
        tokenizer = self.engine.renderer.tokenizer
        as_ids = bool(getattr(vllm_request, "return_tokens_as_token_ids", False))
        logprob_token_ids = getattr(vllm_request, "logprob_token_ids", None)
        if task == "chat":

            def chat_logprobs(token_ids: Any, step_logprobs: Any) -> Any:
                formatted = chat._create_chat_logprobs(
                    token_ids=token_ids,
                    top_logprobs=step_logprobs,
                    tokenizer=tokenizer,
                    num_output_top_logprobs=vllm_request.top_logprobs,
                    logprob_token_ids=logprob_token_ids,
                    return_as_token_id=as_ids,
                )
                return formatted.model_dump(mode="json", exclude_unset=True)["content"]

            return chat_logprobs
        next_offset = 0

        def completion_logprobs(token_ids: Any, step_logprobs: Any) -> Any:
            nonlocal next_offset
            formatted = completions._create_completion_logprobs(
                token_ids=token_ids,
                top_logprobs=step_logprobs,
                num_output_top_logprobs=vllm_request.logprobs,
                tokenizer=tokenizer,
                logprob_token_ids=logprob_token_ids,
                initial_text_offset=next_offset,
                return_as_token_id=as_ids,
            )
            if formatted.tokens:  # as vllm serve advances it: by the tokens reported
                next_offset = formatted.text_offset[-1] + len(formatted.tokens[-1])
            return formatted.model_dump(mode="json", exclude_unset=True)

        return completion_logprobs

    async def _render(self, request: Submit) -> tuple[Any, Any]:
        """vLLM's request object for ``request``, and its rendered engine input."""
        for name in UNRELAYED:
            if request.params.get(name) not in (None, False, 0):
                raise RequestError(
                    400,
                    f"{name!r} is not served by the asyncllm backend (its answer would lose "
                    "what vLLM computes for it); the enginecore backend (the default) serves "
                    "it, see docs/engines.md",
                    "invalid_request_error",
                )
        import pydantic
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        body: dict[str, Any] = dict(request.params)
        body["model"] = request.model
        try:
            if request.task == "chat":
                body["messages"] = request.inputs.get("messages")
                vllm_request: Any = ChatCompletionRequest.model_validate(body)
                rendered = await self.renderer.render_chat(vllm_request)
            elif request.task == "completion":
                body["prompt"] = request.inputs.get("prompt")
                vllm_request = CompletionRequest.model_validate(body)
                rendered = await self.renderer.render_completion(vllm_request)
            else:
                raise RequestError(400, f"task {request.task!r} is not served by vLLM")
        except pydantic.ValidationError as exc:
            raise RequestError(400, _validation_message(exc), "invalid_request_error") from exc
        except _client_errors() as exc:
            raise _client_error(exc) from exc
        error = getattr(rendered, "error", None)
        if error is not None:  # vLLM's ErrorResponse
            status = error.code if 400 <= error.code < 600 else 400
            raise RequestError(status, error.message, "invalid_request_error")
        inputs = rendered[1] if request.task == "chat" else rendered
        if len(inputs) != 1:
            raise RequestError(400, "one prompt per request", "invalid_request_error")
        return vllm_request, inputs[0]

    def _sampling_params(self, vllm_request: Any, engine_input: Any) -> Any:
        from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

        if getattr(vllm_request, "use_beam_search", False):
            raise RequestError(
                400, "beam search is not served by trioserve", "invalid_request_error"
            )
        max_tokens = getattr(vllm_request, "max_completion_tokens", None)
        if max_tokens is None:
            max_tokens = vllm_request.max_tokens
        try:
            limit = get_max_tokens(
                self.max_model_len,
                max_tokens,
                _prompt_length(engine_input),
                self.default_sampling_params,
                self.override_max_tokens,
                truncate_prompt_tokens=vllm_request.truncate_prompt_tokens,
            )
            return vllm_request.to_sampling_params(limit, self.default_sampling_params)
        except _client_errors() as exc:
            raise _client_error(exc) from exc


def _prompt_length(engine_input: Any) -> int:
    if isinstance(engine_input, dict):
        ids = engine_input.get("prompt_token_ids")
        if ids is None:
            ids = engine_input.get("prompt", "")
        return len(ids)
    return len(getattr(engine_input, "prompt_token_ids", ()) or ())


def _validation_message(exc: Any) -> str:
    parts = []
    for error in exc.errors()[:10]:
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(parts) or str(exc)


def _client_errors() -> tuple[type[BaseException], ...]:
    """What vLLM raises for a request's own fault (its server answers 400 to these)."""
    from vllm.exceptions import VLLMClientError

    return (ValueError, TypeError, VLLMClientError)


def _client_error(exc: BaseException) -> RequestError:
    return RequestError(400, str(exc) or type(exc).__name__, "invalid_request_error")


def _vllm_error(exc: BaseException) -> RequestError:
    """A failure of vLLM's, mapped to the status vLLM's own server would answer."""
    from vllm.v1.engine.exceptions import EngineDeadError

    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if isinstance(cause, _client_errors()):  # vLLM wraps some in EngineGenerateError
        return _client_error(cause)
    if isinstance(exc, EngineDeadError):
        return RequestError(503, "vLLM's engine is dead", "engine_unavailable")
    log.error("vLLM failed a request: %r", exc)
    return RequestError(500, f"vLLM error: {type(cause).__name__}")


# -- serving ------------------------------------------------------------------------------


def serve_asyncllm(
    model: str,
    vllm_args: Sequence[str],
    process: ProcessOptions,
    curve: CurveServerKeys | None,
    *,
    metrics_port: int | None,
) -> int:
    """Serve ``model`` with ``AsyncLLM`` until a signal has drained the engine or its parent
    is gone (0), or its EngineCore died (1). ``vllm_args``: as ``vllm serve`` takes them
    (its own parser reads them: a usage error is its one line, status 2)."""
    args = vllm_parser().parse_args([model, *vllm_args])
    if args.model_tag is not None:  # vLLM's positional MODEL, as `vllm serve` takes it
        args.model = args.model_tag
    args.metrics_port = metrics_port
    if getattr(args, "tool_call_parser", None) or getattr(args, "enable_auto_tool_choice", False):
        # The frontend parses answers (text/agents); vLLM's engine has no use for these.
        log.warning(
            "--tool-call-parser and --enable-auto-tool-choice are the frontend's: give them "
            "to `trioserve run` (this engine renders the tools and leaves the parsing to it)"
        )
    died = False
    try:
        died = asyncio.run(_serve(args, process, curve))
    except KeyboardInterrupt:
        pass
    if died:
        log.error("vLLM engine stopped: its EngineCore died")
        return 1
    log.info("vLLM engine stopped")
    return 0


def vllm_parser() -> argparse.ArgumentParser:
    """Every option of ``vllm serve`` (its parser adds the positional MODEL too)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):  # type: ignore[misc]  # (vLLM is untyped here)
        """vLLM's parser, with a usage error in one line (vLLM's usage is 300 lines)."""

        def error(self, message: str) -> NoReturn:
            sys.stderr.write(f"{self.prog}: error: {message} (see: vllm serve --help)\n")
            raise SystemExit(2)

    parser: argparse.ArgumentParser = make_arg_parser(
        Parser(prog="trioserve engine vllm --backend asyncllm")
    )
    return parser


async def _serve(
    args: argparse.Namespace, process: ProcessOptions, curve: CurveServerKeys | None
) -> bool:
    """Serve until cancelled (a signal, the parent gone); True if vLLM's EngineCore died
    (the process then exits, so that frontends see the engine gone within their heartbeat,
    instead of a live engine whose every request fails)."""
    import zmq
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.renderers.chat_utils import load_chat_template
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.v1.engine.async_llm import AsyncLLM

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    cancel_on_signals(task)

    figures = SchedulerFigures()
    engine_args = AsyncEngineArgs.from_cli_args(args)
    try:
        vllm_config = engine_args.create_engine_config()
    except Exception as exc:  # vLLM's checks of the model and its options, whatever they raise
        raise CommandError(
            f"vLLM refused the model {args.model} or its options: {_one_line(exc)}", 2
        ) from exc
    log.info("loading %s with vLLM", args.model)
    engine = AsyncLLM.from_vllm_config(
        vllm_config,
        stat_loggers=[_figures_logger_factory(figures)],
        enable_log_requests=engine_args.enable_log_requests,
        disable_log_stats=engine_args.disable_log_stats,
    )
    watcher = None
    died: list[bool] = []
    death_watch = loop.create_task(_exit_when_dead(engine, task, died))
    try:
        renderer = OnlineRenderer(
            model_config=engine.model_config,
            renderer=engine.renderer,
            request_logger=None,
            chat_template=load_chat_template(args.chat_template),
            chat_template_content_format=args.chat_template_content_format,
            trust_request_chat_template=args.trust_request_chat_template,
            default_chat_template_kwargs=getattr(args, "default_chat_template_kwargs", None),
        )
        renderer.warmup()
        names = args.served_model_name or [args.model]
        backend = VllmBackend(
            engine, renderer, names, figures, _servings(engine, renderer, names, args)
        )
        parent = process.parent()
        if parent is not None:
            watcher = loop.create_task(exit_with_parent_asyncio(parent, task))
        started: asyncio.Future[AsyncioEngine] = loop.create_future()
        serving = loop.create_task(
            serve_engine_asyncio(
                backend,
                process.bind,
                frontend_timeout=process.frontend_timeout,
                log_aborts=process.log_aborts,
                started=started,
                curve=curve,
                # From here SIGTERM drains (the SDK's handlers replace the ones above).
                drain_on_signals=True,
                grace_period=process.grace_period,
            )
        )
        try:
            waits: set[asyncio.Future[Any]] = {started, serving}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not started.done():  # serving ended before it was bound
                try:
                    serving.result()
                except zmq.ZMQError as exc:
                    raise bind_error(process.bind, exc) from exc
            served = started.result()
            if args.metrics_port is not None:
                _serve_metrics(args.metrics_port, served.stats)
            log.info(
                "vLLM engine serving %s on %s (%s)",
                ", ".join(names),
                process.bind,
                security(curve),
            )
            await serving
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
    except asyncio.CancelledError:
        pass
    finally:
        if watcher is not None:
            watcher.cancel()
        death_watch.cancel()
        engine.shutdown()
    return bool(died)


def _one_line(exc: BaseException) -> str:
    """What vLLM said, in one line: a pydantic error's first message, else the first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return str(errors()[0]["msg"])
        except (TypeError, LookupError):
            pass
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _servings(engine: Any, renderer: Any, names: list[str], args: argparse.Namespace) -> Any:
    """vLLM's own chat and completion serving objects, for their logprob formatting."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    models = OpenAIServingModels(
        engine_client=engine,
        base_model_paths=[BaseModelPath(name=name, model_path=args.model) for name in names],
    )
    chat = OpenAIServingChat(
        engine_client=engine,
        models=models,
        response_role="assistant",
        online_renderer=renderer,
        request_logger=None,
        chat_template=None,
        chat_template_content_format=args.chat_template_content_format,
    )
    completions = OpenAIServingCompletion(
        engine_client=engine, models=models, online_renderer=renderer, request_logger=None
    )
    return chat, completions


def _serve_metrics(port: int, stats: Stats) -> None:
    """vLLM's own Prometheus metrics (its scheduler's gauges, requests by finish reason,
    tokens) and the SDK's account of the requests it served, on loopback."""
    import prometheus_client
    from prometheus_client.core import CounterMetricFamily

    class SdkStats:
        def collect(self) -> Any:
            for name, value in attrs.asdict(stats).items():
                yield CounterMetricFamily(
                    f"trioserve_engine_{name}", f"{name} (the engine SDK's Stats)", value=value
                )

    prometheus_client.REGISTRY.register(SdkStats())
    server, _thread = prometheus_client.start_http_server(port, addr="127.0.0.1")
    log.info("metrics on http://127.0.0.1:%d/metrics", server.server_port)


#: Seconds between two looks at whether vLLM's EngineCore is still alive (vLLM's own
#: monitor thread marks it dead when the process exits; reading the mark costs nothing).
DEATH_CHECK_INTERVAL = 0.2


async def _exit_when_dead(engine: Any, task: asyncio.Task[Any], died: list[bool]) -> None:
    """Stop serving once vLLM says its engine is dead (``AsyncLLM.errored``: the EngineCore
    process exited, or its output loop failed)."""
    while not engine.errored:  # noqa: ASYNC110 - vLLM's flag, set by its monitor thread
        await asyncio.sleep(DEATH_CHECK_INTERVAL)
    log.error("vLLM's EngineCore is dead; stopping this engine (its frontends see it gone)")
    died.append(True)
    task.cancel()

"""vLLM's EngineCore as an engine link: the frontend is EngineCore's client, with no process
in between (``trioserve run --vllm MODEL``, the direct path; docs/engines.md).

- **Prepare** (:class:`VllmText`, in a worker thread: a long prompt must not stall other
  streams): the chat template rendered and the prompt tokenized by the text layer
  (:mod:`trioserve.text`), the OpenAI parameters lowered to vLLM's ``SamplingParams`` and
  validated as vLLM validates them. Whatever the text layer refuses is a 400 naming the
  parameter, before anything reaches the engine (EngineCore wedges on an invalid ADD).
- **Submit** (:class:`VllmLink`): one ADD, its request id this frontend's own (unique
  across the engine's clients).
- **Outputs**: token ids in, the same :class:`~trioserve.protocol.OutputItem` deltas the
  writers get from any engine out: text from the incremental detokenizer, usage counted
  from the ids, ``finish_reason`` as vLLM names it, logprobs in the OpenAI shape of the
  task. A stop string matched here ends the request successfully
  (``Subscription.conclude``): one ABORT to the engine, ``finish_reason: "stop"``, the
  string as ``stop_reason`` (a stop token's id, when the engine stopped on one).
- **Figures**: the scheduler's running, waiting and KV-cache usage of every step reach
  routing and the same gauges as a pong's.
- **Death**: when the client loses the engine (socket monitor, heartbeat,
  ``ENGINE_CORE_DEAD``) every request in flight ends at once with one ``engine_lost``
  error and the link is out of service (``/health`` 503).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

import trio

from .. import metrics
from ..ends import EndReason
from ..engine import Prepared, Preparer, Subscription
from ..engine.subscription import DEFAULT_BUFFER
from ..enginecore import codec
from ..enginecore.client import EngineCoreClient
from ..enginecore.events import RequestTimes
from ..errors import EngineLostError, TextInputError
from ..protocol import ErrorInfo, ModelCard, OutputItem, Submit, Usage
from ..text.assets import ModelText
from ..text.background import background
from ..text.generation import Delta, GenerationText
from ..text.registry import ServedText
from ..text.requests import Prepared as TextPrepared
from ..text.requests import prepare, small_enough_inline, unserved_field
from ..text.sampling import EngineLimits

log = logging.getLogger(__name__)

#: The tasks the direct path serves.
CAPABILITIES = ("chat", "completion")


class VllmText:
    """The direct path's :class:`~trioserve.engine.link.Preparer`: a submit into the token
    ids and sampling parameters of one EngineCore request."""

    def __init__(self, model: ModelText, limits: EngineLimits) -> None:
        self.served = ServedText(model, limits)

    @property
    def model(self) -> ModelText:
        return self.served.text

    def prepare_at_once(self, message: Submit) -> Prepared | None:
        if small_enough_inline(message.task, message.inputs, message.params):
            return self.prepare_now(message)  # cheaper than the hop to a thread
        return None

    async def prepare(self, message: Submit) -> Prepared:
        prepared = self.prepare_at_once(message)
        if prepared is not None:
            return prepared
        # Cancelling abandons the thread's result (a tokenization runs to its end, alone).
        return await trio.to_thread.run_sync(
            background(self.prepare_now), message, abandon_on_cancel=True
        )

    def prepare_now(self, message: Submit) -> Prepared:
        """What :meth:`prepare` does, in the calling thread: the text layer's
        :func:`~trioserve.text.requests.prepare`, as the shared engine and the render
        routes prepare a request."""
        params = message.params
        unserved = unserved_field(params)
        if unserved is not None:
            name, what = unserved
            raise TextInputError(f"{what} are not served on the direct vLLM path", param=name)
        ready = prepare(
            self.served,
            message.task,
            dict(message.inputs),
            params,
            stream=bool(params.get("stream", False)),
        )
        return Prepared(message, self, ready)


class VllmLink:
    """vLLM's EngineCore, through this process's :class:`EngineCoreClient`, as an
    :class:`~trioserve.engine.link.EngineLink`. Made by :class:`VllmLinks`."""

    def __init__(
        self,
        client: EngineCoreClient,
        text: VllmText,
        models: Sequence[str],
        address: str,
        frontend_id: str,
        on_change: Callable[[], None],
    ) -> None:
        self.client = client
        self.text = text
        self.preparer: Preparer | None = text
        self.address = address
        self._on_change = on_change
        self._frontend_id = frontend_id
        self._prefix = ""
        self._counter = 0
        #: Set by :meth:`attach` (an engine that came back, ``--vllm-attach``).
        self._attached = trio.Event()
        self._models = [ModelCard(name, owned_by="vllm") for name in models]
        self._model_names = frozenset(models)  # (every request asks: no generator a time)
        self.draining = False
        self.retiring = False
        self.scope = trio.CancelScope()
        self.kv_cache_usage: float | None = None
        self.running = self.waiting = 0
        self._in_flight_at_stats = 0
        self._streams: dict[str, _Stream] = {}
        #: Subscriptions holding outputs for their sinks until the client's pass ends.
        self._held: list[Subscription] = []
        self._gauges = [
            gauge.labels(engine=address)
            for gauge in (
                metrics.ENGINE_RUNNING,
                metrics.ENGINE_QUEUED,
                metrics.ENGINE_KV_CACHE_USAGE,
                metrics.ENGINE_CONNECTED,
                metrics.ENGINE_DRAINING,
            )
        ]
        self._gauges[4].set(0)
        self._hook(client)

    def _hook(self, client: EngineCoreClient) -> None:
        #: Request ids in the engine: this frontend's, the client's index, a random part
        #: (an engine that came back) and a counter, so no two clients of the engine
        #: (workers, frontends) ever share one.
        self._prefix = f"{self._frontend_id}-{client.client_index}-{os.urandom(3).hex()}-"
        client.on_stats = self._on_stats
        client.on_tokens = metrics.ENGINE_GENERATION_TOKENS.labels(engine=self.address).inc
        client.on_pass_end = self._release_held
        self._gauges[3].set(1)

    def attach(self, client: EngineCoreClient, text: VllmText) -> None:
        """Serve through ``client`` from now on: the engine this link lost is back (a new
        EngineCore, connected and ready; ``--vllm-attach``)."""
        self.client = client
        self.text = text
        self.preparer = text
        self._hook(client)
        self._attached.set()

    # -- state ---------------------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        return self.client.failure

    @property
    def ready(self) -> bool:
        return self.client.failure is None

    @property
    def accepting(self) -> bool:
        return self.ready and not self.retiring

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    @property
    def load(self) -> int:
        since = self.in_flight - self._in_flight_at_stats
        return max(self.in_flight, self.running + self.waiting + since)

    @property
    def models(self) -> Sequence[ModelCard]:
        return self._models if self.ready else ()

    @property
    def capabilities(self) -> Sequence[str]:
        return CAPABILITIES if self.ready else ()

    def serves(self, model: str | None, capability: str) -> bool:
        if not self.ready or capability not in CAPABILITIES:
            return False
        return model is None or self.serves_model(model)

    def serves_model(self, model: str) -> bool:
        return self.ready and model in self._model_names

    def retire(self) -> None:
        self.retiring = True
        self._on_change()
        if not self._streams:
            self.scope.cancel()

    def unretire(self) -> None:
        if self.retiring and not self.scope.cancel_called:
            self.retiring = False
            self._on_change()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch the client until this is cancelled. When the engine is lost (its requests
        have then ended, each with its error: :meth:`_Stream.lost`) the link is out of
        service until :meth:`attach` gives it an engine again, if ever."""
        task_status.started()
        with self.scope:
            while True:
                await self.client.lost.wait()
                log.error("vLLM's EngineCore at %s is lost: %s", self.address, self.client.failure)
                self._gauges[3].set(0)
                self._forget_figures()
                self._on_change()
                while self.client.failure is not None:
                    self._attached = trio.Event()
                    await self._attached.wait()
                log.info("vLLM's EngineCore at %s is back", self.address)
                self._on_change()

    def _on_stats(self, stats: codec.SchedulerStats) -> None:
        self.running = stats.num_running_reqs
        self.waiting = stats.num_waiting_reqs + stats.num_skipped_waiting_reqs
        self.kv_cache_usage = stats.kv_cache_usage
        self._in_flight_at_stats = self.in_flight
        self._gauges[0].set(self.running)
        self._gauges[1].set(self.waiting)
        self._gauges[2].set(stats.kv_cache_usage)

    def _forget_figures(self) -> None:
        self.running = self.waiting = self._in_flight_at_stats = 0
        self.kv_cache_usage = None
        for gauge in self._gauges[:3]:
            gauge.set(0)

    # -- requests --------------------------------------------------------------------------

    def submit(
        self,
        prepared: Prepared,
        buffer: int = DEFAULT_BUFFER,
        on_failure: Callable[[EndReason], None] | None = None,
    ) -> Subscription:
        message = prepared.message
        if message.request_id in self._streams:
            raise ValueError(f"request id {message.request_id!r} is already in flight")
        ready: TextPrepared = prepared.payload
        prompt, sampling = ready.prompt, ready.sampling
        sub = Subscription(self, message.request_id, buffer, on_failure)
        self._counter += 1
        engine_id = f"{self._prefix}{self._counter}"
        stream = _Stream(self, sub, engine_id, message.task, ready)
        request = codec.EngineCoreRequest(
            request_id=engine_id,
            prompt_token_ids=prompt.token_ids,
            mm_features=None,
            sampling_params=codec.sampling_params(sampling.params),
            pooling_params=None,
            arrival_time=time.time(),
            lora_request=None,
            cache_salt=message.params.get("cache_salt"),
            data_parallel_rank=None,
            priority=sampling.priority,
        )
        self.client.add(request, stream)  # raises EngineLostError / EngineOverloadedError
        self._streams[message.request_id] = stream
        return sub

    def adopt(self, sub: Subscription, prepared: Prepared) -> None:
        raise EngineLostError("the direct vLLM path has one engine: no failover")

    def refusal(self, error: ErrorInfo) -> str | None:
        return None  # EngineCore refuses nothing before it starts a request

    def forget(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.sub = None  # deliver nothing more
            if stream.ended:
                del self._streams[request_id]
        if not self._streams and self.retiring:
            self.scope.cancel()

    def queue_abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None and not stream.ended:
            stream.ended = True
            self.client.abort([stream.engine_id])

    def hold(self, sub: Subscription) -> None:
        # Released when the client's pass over the waiting steps ends: a frontend behind
        # the engine writes each stream's outputs of several steps at once.
        self._held.append(sub)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for sub in held:
            sub.release()  # (guarded: a failing sink ends its own request)


class _Stream:
    """One request's outputs: token ids in, :class:`OutputItem` out (an
    :class:`~trioserve.enginecore.client.OutputSink`). Each step's text, logprobs, kept ids,
    end, and with the first item what the request asked about its prompt, are the text
    layer's (:class:`~trioserve.text.generation.GenerationText`, as on the shared engine)."""

    __slots__ = ("ended", "engine_id", "link", "seq", "sub", "text", "times")

    def __init__(
        self, link: VllmLink, sub: Subscription, engine_id: str, task: str, ready: TextPrepared
    ) -> None:
        self.link = link
        self.sub: Subscription | None = sub
        self.engine_id = engine_id
        self.ended = False
        self.text = GenerationText(link.text.model, task, ready)
        self.seq = 0
        #: The engine's queued and scheduled times, once its outputs carry events.
        self.times: RequestTimes | None = None

    def output(self, output: codec.EngineCoreOutput, timestamp: float = 0.0) -> None:
        reason = output.finish_reason
        if output.events:
            if self.times is None:
                self.times = RequestTimes()
            self.times.update(output.events)
        if reason is not None:
            self.ended = True
            self.link._streams.pop(self.sub.request_id if self.sub else "", None)
        sub = self.sub
        if sub is None:
            return
        if output.new_prompt_logprobs_tensors is not None:
            self.text.add_prompt_rows(output.new_prompt_logprobs_tensors.rows())
        lists = output.new_logprobs
        delta = self.text.step(
            output.new_token_ids,
            None if reason is None else codec.finish_reason_name(reason),
            None if lists is None else lists.rows(),
            output.stop_reason,
        )
        self.seq += 1
        if delta is None:
            return
        if delta.error:
            sub.deliver(
                OutputItem(
                    sub.request_id,
                    self.seq,
                    error=ErrorInfo(500, "vLLM's engine failed the request", "engine_error"),
                )
            )
        elif delta.stopped:
            # The frontend's own end: one ABORT, a 200 with finish_reason "stop".
            sub.conclude(self._item(delta))
        else:
            sub.deliver(self._item(delta))

    def _item(self, delta: Delta) -> OutputItem:
        assert self.sub is not None
        item = OutputItem(self.sub.request_id, self.seq, data=delta.text or None)
        item.logprobs = delta.logprobs
        item.token_ids = delta.token_ids
        item.prompt_token_ids = delta.prompt_token_ids
        item.prompt_logprobs = delta.prompt_logprobs
        if delta.finish_reason is not None:
            item.finish_reason = delta.finish_reason
            item.usage = Usage(self.text.prompt_tokens, self.text.completion_tokens)
            item.stop_reason = delta.stop_reason
            if self.times is not None:
                item.queue_time = self.times.queue_time
        return item

    def lost(self, reason: str) -> None:
        self.ended = True
        sub = self.sub
        if sub is not None:
            sub.fail(EngineLostError(f"vLLM's EngineCore is lost: {reason}"), EndReason.ENGINE_LOST)


class VllmLinks:
    """The :data:`~trioserve.engine.link.LinkFactory` of one connected EngineCore client
    (``open_engine_client(links=[(address, VllmLinks(...))])``)."""

    def __init__(self, client: EngineCoreClient, text: VllmText, models: Sequence[str]) -> None:
        self.client = client
        self.text = text
        self.models = list(models)
        self._made: list[VllmLink] = []

    def __call__(self, address: str, frontend_id: str, on_change: Callable[[], None]) -> VllmLink:
        link = VllmLink(self.client, self.text, self.models, address, frontend_id, on_change)
        self._made.append(link)
        return link

    def attach(self, client: EngineCoreClient, text: VllmText) -> None:
        """A new EngineCore in place of the lost one: every link made serves through it."""
        self.client, self.text = client, text
        for link in self._made:
            link.attach(client, text)


__all__ = ["VllmLink", "VllmLinks", "VllmText"]

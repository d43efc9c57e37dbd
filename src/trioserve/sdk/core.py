"""The engine side of the protocol, sans-io: who asked for what, and what to send back.

:class:`EngineCore` is fed frames (``handle``) and outputs (``output``) and answers with
actions (start this generation, cancel that one) and frames to send (``flush``). The trio
and asyncio shells (``sdk/trio_shell.py``, ``sdk/asyncio_shell.py``) own the socket, the
clock and the generation tasks; everything they must agree on lives here, once, down to
what a generation task does (:meth:`EngineCore.run_generation`, which awaits only the
backend, so that it runs on either event loop).

Requests are keyed by ``(frontend identity, request id)``: request ids are the frontend's,
so two frontends may use the same one.
"""

from __future__ import annotations

import logging
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

import attrs

from ..errors import PeerProtocolError
from ..errors import RequestError as RequestError  # the SDK's: a backend raises it
from ..protocol import (
    PROTOCOL_VERSION,
    Abort,
    ErrorInfo,
    Hello,
    Limits,
    ModelCard,
    OutputItem,
    Outputs,
    Ping,
    Pong,
    Reject,
    Submit,
    Usage,
    Welcome,
    decode,
    encode,
)

log = logging.getLogger(__name__)

Key = tuple[bytes, str]

#: Output items per frame; a step with more is split (keeps frames and decode time bounded).
MAX_ITEMS_PER_FRAME = 1024
#: The signals that drain an engine served with ``drain_on_signals`` (a second one ends
#: the grace period at once).
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Seconds a drained engine waits for its last frames to leave its outbox, and
#: milliseconds libzmq then has to hand them to the kernel (``ZMQ_LINGER``) at close.
DRAIN_FLUSH_TIMEOUT = 2.0
DRAIN_LINGER_MS = 2_000


@attrs.frozen
class Output:
    """What a backend yields: one delta, optionally the last one."""

    data: str | bytes | None = None
    modality: str = "text"
    usage: Usage | None = None
    finish_reason: str | None = None
    mime_type: str | None = None
    #: This delta's log probabilities, in the OpenAI shape of the request's task.
    logprobs: Any = None
    #: Seconds the request waited in the backend's queue before its generation began,
    #: where the backend has one; give it with the last output (``OutputItem.queue_time``).
    queue_time: float | None = None
    #: With ``finish_reason="stop"``: the stop string matched (str) or the stop token
    #: generated (int), as vLLM's ``stop_reason``; None for the end of sequence.
    stop_reason: str | int | None = None
    #: This delta's token ids, when the request asked for them (``return_token_ids``).
    token_ids: list[int] | None = None
    #: With the first output, when the request asked: the prompt's token ids and its
    #: log probabilities, as vLLM answers them (``OutputItem.prompt_logprobs``).
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[Any] | None = None


@attrs.frozen
class EngineLoad:
    """A backend's own account of its load, for pongs (see ``Backend.load``)."""

    running: int
    queued: int
    kv_cache_usage: float | None = None


class Backend(Protocol):
    """What the SDK serves. ``generate`` is cancelled when the request is aborted.

    Optionally, ``load() -> EngineLoad``: the backend's own load figures for pongs (a
    backend with a scheduler of its own, like vLLM's, knows better than the SDK's count
    of running requests).
    """

    engine_id: str
    models: list[ModelCard]
    capabilities: list[str]

    def generate(self, request: Submit) -> AsyncIterator[Output]:
        """The request's outputs, in order (an ``async def`` with ``yield`` is one); an
        ``aclose`` it has is awaited when the request ends."""
        ...


@attrs.define
class Stats:
    """Engine-side accounting, for operators and tests."""

    submitted: int = 0
    finished: int = 0  # ended by the engine (finish reason or error)
    aborted: int = 0  # ended by an abort from the frontend
    orphaned: int = 0  # ended because their frontend went silent
    refused: int = 0  # ...of the finished, refused at once (draining, or at the limit)
    cut_off: int = 0  # ...of the finished, ended when the drain's grace period ran out
    aborts_received: int = 0  # request ids named in abort frames, known or not
    unknown_aborts: int = 0  # ...of which named no running request
    malformed_frames: int = 0


@attrs.define
class Start:
    key: Key
    request: Submit


@attrs.define
class Cancel:
    key: Key
    reason: str


@attrs.define
class _Running:
    request: Submit
    seq: int = 0


class EngineCore:
    def __init__(
        self,
        backend: Backend,
        *,
        frontend_timeout: float = 5.0,
        limits: Limits | None = None,
        log_aborts: bool = False,
        track_ends: bool = False,
        on_end: Callable[[Key, str], None] | None = None,
    ) -> None:
        self.backend = backend
        self.frontend_timeout = frontend_timeout
        self.limits = limits or Limits()
        self.log_aborts = log_aborts
        self.session = uuid.uuid4().hex[:16]
        self.stats = Stats()
        self.running: dict[Key, _Running] = {}
        #: With ``track_ends`` (tests): key -> every end seen, "finished" | "aborted" |
        #: "orphaned". Unbounded by design, so off by default.
        self.ends: dict[Key, list[str]] | None = {} if track_ends else None
        #: Called with (key, how) whenever a request ends; for measurements.
        self.on_end = on_end
        self._last_seen: dict[bytes, float] = {}
        self._pending: dict[bytes, list[OutputItem]] = {}
        self._replies: list[tuple[bytes, bytes]] = []
        #: Set by :meth:`drain`: new requests are refused, frontends are told.
        self.draining = False

    # -- drain -------------------------------------------------------------------------

    def drain(self) -> None:
        """Stop taking requests: every later ``submit`` is refused with a 503
        ``engine_draining`` error item (frontends resubmit it to another engine), and
        every frontend heard from gets a ``pong`` saying so now, unasked, so that it stops
        routing here at once rather than at its next ping. Requests already running go
        on; the shell ends them with :meth:`cut_off` when its grace period is over."""
        if self.draining:
            return
        self.draining = True
        log.log(
            logging.INFO if self.running else logging.DEBUG,  # idle: its Stats line says it
            "draining: refusing new requests, finishing %d; telling %d frontend(s)",
            len(self.running),
            len(self._last_seen),
        )
        for identity in self._last_seen:
            self._reply(identity, self._pong(0))

    @property
    def idle(self) -> bool:
        """No request is running."""
        return not self.running

    def cut_off(self) -> list[Cancel]:
        """End every request still running with a 503 ``engine_stopped`` error item (the
        drain's grace period is over); the shell cancels the generations returned."""
        if self.running:
            log.warning(
                "drain: grace period over; ending %d request(s) still running",
                len(self.running),
            )
        actions = []
        for key, running in list(self.running.items()):
            self._error(
                key,
                running.seq,
                503,
                "the engine stopped (its drain grace period ran out) before the request finished",
                "engine_stopped",
            )
            self.stats.finished += 1
            self.stats.cut_off += 1
            self._end(key, "finished")
            actions.append(Cancel(key, "cut_off"))
        return actions

    # -- input -------------------------------------------------------------------------

    def _pong(self, seq: int) -> Pong:
        """Load figures: the backend's own where it keeps them (``load()``: vLLM's
        scheduler), else the requests this engine is generating for."""
        load = getattr(self.backend, "load", None)
        if load is None:
            return Pong(
                seq, self.session, running=len(self.running), queued=0, draining=self.draining
            )
        figures: EngineLoad = load()
        return Pong(
            seq,
            self.session,
            running=figures.running,
            queued=figures.queued,
            kv_cache_usage=figures.kv_cache_usage,
            draining=self.draining,
        )

    def handle(self, identity: bytes, frame: bytes, now: float) -> list[Start | Cancel]:
        """One frame from a frontend; returns what the shell must start or cancel."""
        try:
            message = decode(frame)
        except PeerProtocolError as exc:
            self.stats.malformed_frames += 1
            log.warning("dropping malformed frame from %r: %s", identity, exc)
            return []
        self._last_seen[identity] = now
        if isinstance(message, Ping):
            self._reply(identity, self._pong(message.seq))
        elif isinstance(message, Submit):
            return self._on_submit(identity, message)
        elif isinstance(message, Abort):
            return self._on_abort(identity, message)
        elif isinstance(message, Hello):
            self._on_hello(identity, message)
        else:
            log.warning("dropping unexpected %s from %r", type(message).__name__, identity)
        return []

    def _on_hello(self, identity: bytes, hello: Hello) -> None:
        if hello.protocol_version != PROTOCOL_VERSION:
            log.error(
                "refusing frontend %s: it speaks protocol %d, this engine %d",
                hello.frontend_id,
                hello.protocol_version,
                PROTOCOL_VERSION,
            )
            self._reply(
                identity,
                Reject(PROTOCOL_VERSION, f"this engine speaks protocol {PROTOCOL_VERSION} only"),
            )
            return
        backend = self.backend
        self._reply(
            identity,
            Welcome(
                protocol_version=PROTOCOL_VERSION,
                engine_id=backend.engine_id,
                session=self.session,
                models=list(backend.models),
                capabilities=list(backend.capabilities),
                limits=self.limits,
                frontend_timeout=self.frontend_timeout,
                draining=self.draining,
            ),
        )

    def _on_submit(self, identity: bytes, submit: Submit) -> list[Start | Cancel]:
        key = (identity, submit.request_id)
        self.stats.submitted += 1
        if key in self.running:
            self._error(key, 0, 409, f"request id {submit.request_id!r} is already running")
            return []
        if self.draining:
            self._refuse(
                key,
                "engine_draining",
                "the engine is draining (shutting down) and takes no new requests; "
                "retry: another engine may serve it",
            )
            return []
        limit = self.limits.max_requests
        if limit and len(self.running) >= limit:
            self._refuse(key, "engine_error", f"the engine is at its limit of {limit} requests")
            return []
        self.running[key] = _Running(submit)
        return [Start(key, submit)]

    def _refuse(self, key: Key, type: str, message: str) -> None:
        """Refuse a request at once: a 503 error item as its first item, which a frontend
        may resubmit to another engine (docs/protocol.md §5)."""
        self._error(key, 0, 503, message, type)
        self.stats.finished += 1
        self.stats.refused += 1
        self._end(key, "finished")

    def _on_abort(self, identity: bytes, abort: Abort) -> list[Start | Cancel]:
        actions: list[Start | Cancel] = []
        self.stats.aborts_received += len(abort.request_ids)
        for request_id in abort.request_ids:
            key = (identity, request_id)
            if key in self.running:
                if self.log_aborts:
                    log.info("abort received for %s", request_id)
                self.stats.aborted += 1
                self._end(key, "aborted")
                actions.append(Cancel(key, "abort"))
            else:
                self.stats.unknown_aborts += 1
        return actions

    def expire(self, now: float) -> list[Cancel]:
        """Cancel the requests of frontends silent for longer than ``frontend_timeout``."""
        dead = {
            ident for ident, seen in self._last_seen.items() if now - seen > self.frontend_timeout
        }
        if not dead:
            return []
        for ident in dead:
            del self._last_seen[ident]
            self._pending.pop(ident, None)
        actions = []
        for key in [key for key in self.running if key[0] in dead]:
            log.warning("frontend %r went silent: aborting its request %s", key[0], key[1])
            self.stats.orphaned += 1
            # If the frontend was only slow, not dead, this tells it the request is over;
            # if it is dead, ROUTER drops the frame.
            self._error(
                key,
                self.running[key].seq,
                503,
                f"the engine heard nothing from this frontend for {self.frontend_timeout:g} s "
                "and aborted the request",
                "frontend_timeout",
            )
            self._end(key, "orphaned")
            actions.append(Cancel(key, "orphaned"))
        return actions

    # -- output ------------------------------------------------------------------------

    def output(self, key: Key, out: Output) -> bool:
        """Record one backend output; False if the request is no longer running."""
        running = self.running.get(key)
        if running is None:
            return False
        item = OutputItem(
            request_id=key[1],
            seq=running.seq,
            modality=out.modality,
            data=out.data,
            usage=out.usage,
            finish_reason=out.finish_reason,
            mime_type=out.mime_type,
            logprobs=out.logprobs,
            queue_time=out.queue_time,
            stop_reason=out.stop_reason,
            token_ids=out.token_ids,
            prompt_token_ids=out.prompt_token_ids,
            prompt_logprobs=out.prompt_logprobs,
        )
        running.seq += 1
        self._pending.setdefault(key[0], []).append(item)
        if out.finish_reason is not None:
            self.stats.finished += 1
            self._end(key, "finished")
        return True

    def fail(self, key: Key, error: RequestError) -> None:
        """The backend raised: end the request with an error item."""
        running = self.running.get(key)
        if running is None:
            return
        self._error(key, running.seq, error.status, error.message, error.type, error.param)
        self.stats.finished += 1
        self._end(key, "finished")

    async def run_generation(self, key: Key, request: Submit, wake: Callable[[], None]) -> None:
        """Run the backend's generation of ``request`` to its end: each output recorded
        (``wake`` tells the shell there is something to send) until the request is no
        longer running; the backend's :class:`RequestError`, or any other exception (logged
        with its traceback), is the request's error item; a generation that stops without a
        finish reason is failed. The backend's generator is closed before this returns, so
        its cleanup (an abort of its own engine's request) runs then, not when the garbage
        collector finds it. Cancelling this (the shell's scope or task) is the abort."""
        outputs = self.backend.generate(request)
        try:
            try:
                async for out in outputs:
                    if not self.output(key, out):
                        break
                    wake()
            finally:
                aclose = getattr(outputs, "aclose", None)
                if aclose is not None:
                    await aclose()
        except RequestError as exc:
            self.fail(key, exc)
        except Exception as exc:
            log.exception("backend failed on %s", key[1])
            self.fail(key, RequestError(500, f"backend error: {type(exc).__name__}"))
        self.generation_ended(key)
        wake()

    def generation_ended(self, key: Key) -> None:
        """The backend's generator returned; a request it left without an end is failed."""
        if key in self.running:
            self.fail(key, RequestError(500, "the backend ended without a finish reason"))

    def _error(
        self,
        key: Key,
        seq: int,
        status: int,
        message: str,
        type: str = "engine_error",
        param: str | None = None,
    ) -> None:
        item = OutputItem(key[1], seq, error=ErrorInfo(status, message, type, param))
        self._pending.setdefault(key[0], []).append(item)

    def _end(self, key: Key, how: str) -> None:
        self.running.pop(key, None)
        if self.ends is not None:
            self.ends.setdefault(key, []).append(how)
        if self.on_end is not None:
            self.on_end(key, how)

    def _reply(self, identity: bytes, message: Any) -> None:
        self._replies.append((identity, encode(message)))

    def flush(self) -> Iterable[tuple[bytes, bytes]]:
        """Frames to send now: replies first, then one Outputs frame per frontend."""
        replies, self._replies = self._replies, []
        yield from replies
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        for identity, items in pending.items():
            for start in range(0, len(items), MAX_ITEMS_PER_FRAME):
                yield identity, encode(Outputs(items[start : start + MAX_ITEMS_PER_FRAME]))

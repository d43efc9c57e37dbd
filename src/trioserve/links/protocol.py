"""trioserve's own protocol as an engine link: handshake, heartbeats, demultiplexing.

:class:`ProtocolLink` implements :class:`~trioserve.engine.link.EngineLink` for engines
that speak trioserve's protocol (the SDK's: the mock, ``trioserve engine vllm``, a user's
runner); :class:`~trioserve.links.protocol_client.ProtocolLinks` makes one per address, and
:func:`~trioserve.links.protocol_client.open_protocol_client` is the engine client over
them alone (``protocol_client.py``).

One :class:`~trioserve.transport.zmtp.ZmtpDealer` task owns the connection to the engine; it calls
:meth:`ProtocolLink._on_message` for every frame and routes output items to their
subscriptions with non-blocking sends only, so one slow request never holds up the others.
A heartbeat task sends pings (or, while not connected, hellos) and declares the engine lost
when nothing has been heard from it for ``heartbeat_timeout`` seconds.

An engine that breaks the protocol (a ``reject``, a ``welcome`` of another version, a
ZeroMQ-level error such as a frame over ``max_message``) is marked *failed*
(:meth:`ProtocolLink._fail`): its requests end at once with
:class:`~trioserve.errors.EngineFailedError` (503 ``engine_failed``, one abort each), it
serves nothing, and it is said hello to again after a backoff that doubles with each
failure in a row. Nothing an engine sends ends anything beyond its own connection.

An engine that says it is draining (a ``pong`` or ``welcome`` with ``draining``, see
docs/protocol.md) is routed nothing more (:attr:`ProtocolLink.accepting`); its
requests finish there, and when it falls silent with none left it has *left*, which is not
a failure: one INFO line, no request fails. The engine client lets go of a connection it no
longer wants (an address gone from DNS) the same way: :meth:`ProtocolLink.retire`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import attrs
import trio

from .. import metrics
from ..ends import EndReason
from ..engine import Prepared, Preparer, Subscription
from ..engine.subscription import DEFAULT_BUFFER
from ..errors import (
    EngineFailedError,
    EngineLostError,
    EngineOverloadedError,
    PeerProtocolError,
    ProtocolVersionError,
    UnencodableRequestError,
)
from ..protocol import (
    PROTOCOL_VERSION,
    Abort,
    ErrorInfo,
    Hello,
    ModelCard,
    Outputs,
    Ping,
    Pong,
    Reject,
    Submit,
    Welcome,
    decode,
    encode,
)
from ..transport.curve import CurveClientKeys
from ..transport.zmtp import ZmtpDealer

log = logging.getLogger(__name__)

#: Seconds before an engine that failed is tried again; doubled with each failure in a
#: row, up to FAIL_BACKOFF_MAX (and back to FAIL_BACKOFF once it has served that long).
FAIL_BACKOFF = 1.0
FAIL_BACKOFF_MAX = 30.0
#: The largest ``running``/``queued`` figure a pong may carry (no engine holds 2^31
#: requests); a pong outside 0..MAX_LOAD_FIGURE keeps the engine alive but its figures are
#: ignored, with one warning until a sound pong comes (docs/protocol.md, ``pong``).
MAX_LOAD_FIGURE = 2**31 - 1


@attrs.define
class HeartbeatConfig:
    #: Seconds between pings (and between hellos while not connected).
    interval: float = 1.0
    #: Seconds of silence after which the engine is declared lost.
    timeout: float = 3.0


#: The failover reason of a 503 error item of each type, before any output (any other
#: type: "refused").
_REFUSALS = {"engine_draining": "draining"}


class ProtocolLink:
    """One engine that speaks trioserve's protocol, seen from the frontend: an
    :class:`~trioserve.engine.link.EngineLink`. Made by ``ProtocolLinks``
    (``protocol_client.py``), served by the engine client."""

    #: Its submits go as they are: no preparation.
    preparer: Preparer | None = None

    def __init__(
        self,
        address: str,
        frontend_id: str,
        heartbeat: HeartbeatConfig,
        on_change: Callable[[], None] | None = None,
        *,
        max_message: int | None = None,
        curve: CurveClientKeys | None = None,
    ) -> None:
        self.address = address
        self._on_change = on_change
        self.frontend_id = frontend_id
        self.heartbeat = heartbeat
        self.welcome: Welcome | None = None
        #: Why the engine is out of service (see :meth:`_fail`); None while it is not.
        self.failure: str | None = None
        #: When a failed engine is said hello to again, and the backoff after the next
        #: failure.
        self._retry_at = 0.0
        self._backoff = FAIL_BACKOFF
        self._failed_at = -math.inf
        #: Whether the last pong's figures were out of bounds (warned once per streak).
        self._bad_figures = False
        self.running = 0
        self.queued = 0
        #: The engine's KV-cache usage (0.0 to 1.0) in its last pong, where it reports one.
        self.kv_cache_usage: float | None = None
        #: :attr:`in_flight` when the last sound pong came (see :attr:`load`).
        self._in_flight_at_pong = 0
        self._subs: dict[str, Subscription] = {}
        self._pending_aborts: list[str] = []
        self._ping_seq = 0
        # A stable identity, so the engine knows us again after a reconnect.
        self._pump = ZmtpDealer(
            address,
            frontend_id.encode(),
            self._on_message,
            self._before_flush,
            after_receive=self._release_held,
            max_message=max_message,
            on_error=self._on_link_error,
            curve=curve,
        )
        #: Subscriptions holding items for their sinks until the read pass ends.
        self._held: list[Subscription] = []
        #: Set by the heartbeat when the engine looks silent; judged by the socket owner.
        self._liveness_check = False
        #: When the oldest ping still without any message after it was sent (None: none).
        #: Silence is counted from there, not from the last message: a frontend whose own
        #: loop was too busy to ping has not given the engine anything to answer.
        self._unanswered_since: float | None = None
        self._gauge_running = metrics.ENGINE_RUNNING.labels(engine=address)
        self._gauge_queued = metrics.ENGINE_QUEUED.labels(engine=address)
        self._gauge_kv = metrics.ENGINE_KV_CACHE_USAGE.labels(engine=address)
        self._gauge_connected = metrics.ENGINE_CONNECTED.labels(engine=address)
        self._gauge_connected.set(0)
        self._gauge_draining = metrics.ENGINE_DRAINING.labels(engine=address)
        self._gauge_draining.set(0)
        #: The engine said it is draining: nothing new is routed to it.
        self.draining = False
        #: The client no longer wants this engine (see :meth:`retire`).
        self.retiring = False
        #: The scope :meth:`serve` runs in; cancelled once a retiring engine is idle.
        self.scope = trio.CancelScope()

    # -- state ---------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.welcome is not None

    @property
    def models(self) -> Sequence[ModelCard]:
        welcome = self.welcome
        return welcome.models if welcome is not None else ()

    @property
    def capabilities(self) -> Sequence[str]:
        welcome = self.welcome
        return welcome.capabilities if welcome is not None else ()

    @property
    def accepting(self) -> bool:
        """Welcomed, not draining, not retiring: new requests may be routed here."""
        return self.welcome is not None and not self.draining and not self.retiring

    def retire(self) -> None:
        """Route nothing more here, and stop serving (:attr:`scope`) once the requests in
        flight have ended. Idempotent; :meth:`unretire` takes it back."""
        if not self.retiring:
            self.retiring = True
            log.info(
                "engine %s: letting go (%d request(s) in flight finish first)",
                self.address,
                len(self._subs),
            )
            self._changed()
        if not self._subs:
            self.scope.cancel()

    def unretire(self) -> None:
        """Wanted again before it was let go of."""
        if self.retiring and not self.scope.cancel_called:
            self.retiring = False
            log.info("engine %s: wanted again", self.address)
            self._changed()

    @property
    def in_flight(self) -> int:
        return len(self._subs)

    @property
    def load(self) -> int:
        """Requests at the engine, for routing: its own figures (every frontend's
        requests, running and queued) as of its last pong, plus what this frontend has
        started since then less what has ended; never less than this frontend's own."""
        since_pong = self.in_flight - self._in_flight_at_pong
        return max(self.in_flight, self.running + self.queued + since_pong)

    def serves(self, model: str | None, capability: str) -> bool:
        welcome = self.welcome
        if welcome is None or capability not in welcome.capabilities:
            return False
        return model is None or self.serves_model(model)

    def serves_model(self, model: str) -> bool:
        """Whether the engine declared ``model`` (a loop: no generator per request)."""
        welcome = self.welcome
        if welcome is not None:
            for card in welcome.models:
                if card.id == model:
                    return True
        return False

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    # -- requests --------------------------------------------------------------------------

    def submit(
        self,
        prepared: Prepared | Submit,
        buffer: int = DEFAULT_BUFFER,
        on_failure: Callable[[EndReason], None] | None = None,
    ) -> Subscription:
        """Register a subscription and queue the submit. Does not wait."""
        message = prepared.message if isinstance(prepared, Prepared) else prepared
        sub = Subscription(self, message.request_id, buffer, on_failure)
        self._send_submit(sub, message)
        return sub

    def adopt(self, sub: Subscription, prepared: Prepared) -> None:
        """Take over ``sub``, whose engine did not start it (failover): submit it here.
        Raises as :meth:`submit` does, with ``sub`` unchanged."""
        self._send_submit(sub, prepared.message)
        sub.engine = self

    def refusal(self, error: ErrorInfo) -> str | None:
        """A 503 first item is the engine refusing the request before it began (draining,
        at its limit: docs/protocol.md): another engine may take it."""
        if error.status != 503:
            return None
        return _REFUSALS.get(error.type, "refused")

    def _send_submit(self, sub: Subscription, message: Submit) -> None:
        if message.request_id in self._subs:
            raise ValueError(f"request id {message.request_id!r} is already in flight")
        try:
            frame = encode(message)
        except (OverflowError, TypeError, ValueError) as exc:  # msgpack's refusals
            raise UnencodableRequestError(
                f"the request holds a value the engine protocol cannot carry ({exc})"
            ) from None
        # Aborts queued earlier leave first: a request id reused right after its abort
        # must not have that abort overtake its new submit.
        self._flush_aborts()
        if not self._pump.send([frame]):
            raise EngineOverloadedError(f"engine {self.address} is not accepting frames")
        self._subs[message.request_id] = sub

    def forget(self, request_id: str) -> None:
        subs = self._subs
        subs.pop(request_id, None)
        if not subs and self.retiring:
            self.scope.cancel()  # the last request of an engine let go of has ended

    def queue_abort(self, request_id: str) -> None:
        """Queue one abort; all aborts queued in one scheduling round leave in one frame."""
        self._pending_aborts.append(request_id)
        self._pump.wake()

    def hold(self, sub: Subscription) -> None:
        """``sub`` holds items for its sink: release them when this read pass ends."""
        self._held.append(sub)

    def _release_held(self) -> None:
        """Run by the socket owner after each read pass: the sinks get what came."""
        held = self._held
        if held:
            self._held = []
            for sub in held:
                sub.release()

    def _before_flush(self) -> None:
        """Run by the socket owner after it has read everything waiting."""
        if self._liveness_check:
            self._judge_silence()
        self._flush_aborts()

    def _judge_silence(self) -> None:
        self._liveness_check = False
        since = self._unanswered_since
        silent = 0.0 if since is None else trio.current_time() - since
        if self.welcome is not None and silent > self.heartbeat.timeout:
            self._declare_lost(f"no answer to a ping for {silent:.1f} s")
            self._pump.drop_outbox()

    def _flush_aborts(self) -> None:
        if self._pending_aborts:
            ids, self._pending_aborts = self._pending_aborts, []
            # If the outbox is full, the engine is not reading: it will be declared lost and
            # its own orphan cleanup takes over. Nothing here may block.
            self._pump.send([encode(Abort(ids))])

    # -- socket owner ---------------------------------------------------------------------

    def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 1:
            log.warning("engine %s: dropping a %d-part message", self.address, len(frames))
            return
        try:
            message = decode(frames[0])
        except PeerProtocolError as exc:
            log.warning("engine %s: dropping malformed frame: %s", self.address, exc)
            return
        self._unanswered_since = None
        if self.failure is not None and trio.current_time() < self._retry_at:
            # Out of service: what it says before we say hello again is not heard.
            log.debug("engine %s (failed): dropping %s", self.address, type(message).__name__)
            return
        if isinstance(message, Outputs):
            subs = self._subs
            for item in message.items:
                sub = subs.get(item.request_id)
                if sub is not None:  # else: a late output of an aborted request
                    sub.deliver(item)
        elif isinstance(message, Pong):
            if self.welcome is not None and message.session != self.welcome.session:
                self._declare_lost("the engine restarted")
                return
            if message.draining != self.draining and self.welcome is not None:
                self._set_draining(message.draining)
            self._on_figures(message.running, message.queued, message.kv_cache_usage)
        elif isinstance(message, Welcome):
            self._on_welcome(message)
        elif isinstance(message, Reject):
            self._fail(
                f"it refused protocol version {PROTOCOL_VERSION}: {message.message[:200]!r} "
                f"(it speaks version {message.protocol_version})",
                ProtocolVersionError,
            )
        else:
            log.warning("engine %s: dropping unexpected %s", self.address, type(message).__name__)

    def _on_figures(self, running: int, queued: int, kv_cache_usage: float | None) -> None:
        """A pong's load figures, into the gauges if they are possible at all."""
        if not (
            0 <= running <= MAX_LOAD_FIGURE
            and 0 <= queued <= MAX_LOAD_FIGURE
            and (kv_cache_usage is None or 0.0 <= kv_cache_usage <= 1.0)  # NaN fails too
        ):
            if not self._bad_figures:
                self._bad_figures = True
                log.warning(
                    "engine %s: ignoring pong figures out of bounds (running=%.30s, "
                    "queued=%.30s out of 0..%d; kv_cache_usage=%.30s out of 0..1); warned "
                    "once until they are sound again",
                    self.address,
                    running,
                    queued,
                    MAX_LOAD_FIGURE,
                    kv_cache_usage,
                )
            return
        self._bad_figures = False
        self.running, self.queued = running, queued
        self.kv_cache_usage = kv_cache_usage
        self._in_flight_at_pong = self.in_flight
        self._gauge_running.set(running)
        self._gauge_queued.set(queued)
        if kv_cache_usage is not None:
            self._gauge_kv.set(kv_cache_usage)

    def _on_welcome(self, welcome: Welcome) -> None:
        if welcome.protocol_version != PROTOCOL_VERSION:
            self._fail(
                f"it speaks protocol version {str(welcome.protocol_version)[:30]}, this frontend "
                f"speaks {PROTOCOL_VERSION}",
                ProtocolVersionError,
            )
            return
        if self.failure is not None:
            log.info("engine %s is sound again (it had failed: %s)", self.address, self.failure)
            self.failure = None
        if self.welcome is None:
            log.info(
                "engine %s connected: id=%s models=%s capabilities=%s",
                self.address,
                welcome.engine_id,
                [card.id for card in welcome.models],
                welcome.capabilities,
            )
            if welcome.frontend_timeout and self.heartbeat.interval * 2 > welcome.frontend_timeout:
                log.warning(
                    "engine %s drops frontends silent for %g s, but this frontend pings every "
                    "%g s: its requests may be cancelled as orphans",
                    self.address,
                    welcome.frontend_timeout,
                    self.heartbeat.interval,
                )
        self.welcome = welcome
        self._gauge_connected.set(1)
        if welcome.draining != self.draining:
            self._set_draining(welcome.draining)
        self._changed()

    def _set_draining(self, draining: bool) -> None:
        self.draining = draining
        self._gauge_draining.set(int(draining))
        if draining:
            log.info(
                "engine %s is draining: routing nothing more to it; its %d request(s) finish there",
                self.address,
                len(self._subs),
            )
        self._changed()

    def _on_link_error(self, why: str) -> float:
        """The socket owner dropped the connection because the engine broke ZeroMQ's
        protocol or refused us (a CURVE key it does not accept): the engine fails; the
        owner connects again after the backoff returned."""
        return self._fail(f"its ZeroMQ link failed: {why}")

    def _fail(self, why: str, error_type: type[EngineFailedError] = EngineFailedError) -> float:
        """Take the engine out of service: its requests end now (503 ``engine_failed``, one
        abort each, sent whenever the link works), nothing is routed to it, and hello is
        said again after a backoff, which is returned. One log line per new reason."""
        now = trio.current_time()
        if now - self._failed_at > FAIL_BACKOFF_MAX + self._backoff:  # sound for a while
            self._backoff = FAIL_BACKOFF
        delay, self._backoff = self._backoff, min(self._backoff * 2, FAIL_BACKOFF_MAX)
        self._failed_at = now
        self._retry_at = now + delay
        level = logging.DEBUG if why == self.failure else logging.ERROR
        log.log(
            level,
            "engine %s failed: %s; out of service, failing %d request(s); trying again in %g s",
            self.address,
            why,
            len(self._subs),
            delay,
        )
        self.failure = why
        self.welcome = None
        self._unanswered_since = None
        self._gauge_connected.set(0)
        self._forget_figures()
        error = error_type(f"engine {self.address} failed: {why}")
        for sub in list(self._subs.values()):
            sub.fail(error, EndReason.ENGINE_FAILED)
        self._changed()
        return delay

    def _forget_figures(self) -> None:
        """An engine out of service has no load: routing and gauges start afresh."""
        self.running = self.queued = self._in_flight_at_pong = 0
        self.kv_cache_usage = None
        self._gauge_running.set(0)
        self._gauge_queued.set(0)
        self._gauge_kv.set(0)

    def _declare_lost(self, why: str) -> None:
        if self.draining and not self._subs:
            # It drained and left (or was replaced): its departure fails nothing.
            log.info("engine %s left after draining (%s)", self.address, why)
            self._set_draining(False)
        else:
            log.warning(
                "engine %s lost: %s; failing %d request(s)", self.address, why, len(self._subs)
            )
        self.welcome = None
        self._gauge_connected.set(0)
        self._forget_figures()
        error = EngineLostError(f"engine {self.address} stopped responding ({why})")
        for sub in list(self._subs.values()):
            sub.fail(error, EndReason.ENGINE_LOST)
        self._changed()

    async def _heartbeat(self) -> None:
        hello = encode(Hello(PROTOCOL_VERSION, self.frontend_id))
        while True:
            now = trio.current_time()
            if self.failure is not None and now < self._retry_at:
                pass  # out of service: not a word until the backoff has passed
            elif self.welcome is None:
                if self._pump.pending == 0:
                    self._pump.send([hello])
                else:
                    # The hello is still queued (no peer yet: ZMQ_IMMEDIATE). Whether the
                    # descriptor fires when the connection completes is not something to
                    # rely on, so retry the send on every tick.
                    self._pump.wake()
            else:
                since = self._unanswered_since
                if since is not None and now - since > self.heartbeat.timeout:
                    self._liveness_check = True
                    if self._pump.connected:
                        # Judged by the socket owner, not here: a frontend whose event loop
                        # was busy may simply not have read the pongs yet, and the owner
                        # reads what is waiting first.
                        self._pump.wake()
                    else:  # no connection: nothing can be waiting unread
                        self._judge_silence()
                if since is None:
                    self._unanswered_since = now
                self._ping_seq += 1
                self._pump.send([encode(Ping(self._ping_seq))])
            # Until welcomed, say hello often: the engine may just be starting.
            await trio.sleep(
                self.heartbeat.interval if self.welcome else min(self.heartbeat.interval, 0.1)
            )

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the socket owner and the heartbeat until cancelled (or until :attr:`scope`
        is: a retired engine whose requests have ended)."""
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump.run)
                    nursery.start_soon(self._heartbeat)
                    task_status.started()
        finally:
            # Whatever was still running at the engine is aborted: best effort, since the
            # socket closes right after (what the kernel takes at once leaves). The
            # engine's orphan cleanup is the backstop for frames that never leave.
            for sub in list(self._subs.values()):
                sub.fail(EngineLostError("the frontend is shutting down"), EndReason.DRAIN)
            self._flush_aborts()
            self._pump.close()
            self._gauge_connected.set(0)

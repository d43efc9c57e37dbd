"""A client of vLLM's EngineCore, on trio: the sockets, the handshake, requests, outputs,
utility calls and engine death.

Theory of operation (the boundary's facts: docs/engines.md, ``../shared/vllm-enginecore.md``):

- **The client binds, the engine connects.** Each client of an engine has one input ROUTER
  (requests go out on it, the engine's registration comes in) and one output PULL (each
  engine step's outputs for this client). The engine's DEALER and PUSH reconnect by
  themselves, so a client that binds the same two addresses again (a restarted worker) is
  re-joined without a new handshake.
- **The handshake** is once per engine start, on a ROUTER at the address the engine was
  started with: the engine says HELLO, the client answers with every client's addresses
  (INIT), the engine loads the model, then sends its ready response on each input socket and
  READY on the handshake socket, in either order. :func:`open_enginecore_client` with
  ``handshake=`` does it; a client opened without one waits for the ready response on its
  own input socket (the engine was handed its addresses by another client), or, given
  ``known=`` (the ready response another client of this engine received), only for the
  engine to connect.
- **One task owns each socket** (:class:`~trioserve.transport.zmq_pump.ZmqPump`: pyzmq's
  descriptor is edge-triggered). :meth:`EngineCoreClient.add` and :meth:`~EngineCoreClient.
  abort` never wait: a message leaves at once or is queued, bounded, for the owner.
- **Outputs are demultiplexed** to each request's :class:`OutputSink`, synchronously in the
  output socket's owner task, in the engine's order; a request is forgotten at its final
  output (or when aborted: the engine answers an ABORT with nothing). An output for a
  request this client does not know (one of a previous client on these addresses) is
  answered with an ABORT, and touches nothing else; one for a request it has just aborted
  (the engine's step was under way when the ABORT came) is dropped: one ABORT each.
- **Death.** A killed engine sends nothing. The client watches its sockets' monitors (the
  engine's connection going away), calls a cheap utility as a heartbeat and gives up when no
  answer comes within a deadline, and reads ``ENGINE_CORE_DEAD``. The first of them ends
  every request in flight at once, each with one :meth:`OutputSink.lost`, and the client:
  the body of ``async with open_enginecore_client(...)`` is cancelled and it raises one
  :class:`~trioserve.errors.EngineLostError` naming the reason.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import attrs
import trio
import zmq

from ..errors import (
    EngineCallError,
    EngineLostError,
    EngineOverloadedError,
    PeerProtocolError,
    ProtocolVersionError,
)
from ..transport.zmq_pump import ZmqPump
from . import codec
from .opening import Opening, bind, client_socket, monitor_event
from .opening import handshake as handshake_with

log = logging.getLogger(__name__)

#: Seconds between two heartbeats (a ``get_supported_tasks`` utility call).
HEARTBEAT_INTERVAL = 1.0
#: Seconds a heartbeat may go unanswered before the engine is declared lost: an engine
#: answers between two steps, and a long prefill on CPUs is one step.
HEARTBEAT_TIMEOUT = 30.0
#: Seconds a handshake may take: the engine loads its model in between (vLLM's own
#: frontend waits up to VLLM_ENGINE_READY_TIMEOUT_S, 600 s by default). The default of
#: every load timeout: `trioserve run --vllm-load-timeout`, `trioserve engine vllm
#: --load-timeout`.
LOAD_TIMEOUT = 600.0
#: The utility each heartbeat calls: answered from memory, no model work.
HEARTBEAT_METHOD = "get_supported_tasks"
#: Request ids this client aborted lately, remembered so that the outputs of the step the
#: engine was running when the ABORT reached it are dropped, not answered with a second
#: ABORT.
RECENT_ABORTS = 4096

_MONITOR_EVENTS = int(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)


@attrs.frozen
class ClientAddresses:
    """One client's two sockets (the engine connects to both)."""

    input: str
    output: str

    @classmethod
    def ipc(cls, directory: str, client_index: int) -> ClientAddresses:
        """Unix-socket addresses in ``directory`` (one engine's clients on one host)."""
        base = os.path.join(directory, f"enginecore-{client_index}")
        return cls(f"ipc://{base}-input", f"ipc://{base}-output")


class OutputSink(Protocol):
    """Where one request's outputs go; called in the output socket's owner task, so it must
    not block (a bounded buffer of its own is the caller's)."""

    def output(self, output: codec.EngineCoreOutput, timestamp: float = 0.0) -> None:
        """One step's delta; the last has ``finish_reason`` set, and nothing follows it.
        ``timestamp``: the engine's clock at the step (its ``EngineCoreOutputs``')."""

    def lost(self, reason: str) -> None:
        """The engine died with the request in flight: its one end. Nothing follows it."""


class EngineCoreClient:
    """The handle :func:`open_enginecore_client` yields."""

    def __init__(
        self,
        ready: codec.EngineCoreReadyResponse,
        client_index: int,
        input_pump: ZmqPump,
        outbox_limit: int,
    ) -> None:
        #: The engine's ready response (``max_model_len`` after KV-cache fitting, …).
        self.ready = ready
        self.client_index = client_index
        self._identity = ready.data_parallel_rank.to_bytes(2, "little")
        self._input = input_pump
        self._outbox_limit = outbox_limit
        self._sinks: dict[str, OutputSink] = {}
        self._aborts: list[str] = []
        self._calls: dict[int, _Call] = {}
        self._call_ids = itertools.count(1)
        #: Why the engine is lost (None while it serves).
        self.failure: str | None = None
        #: Set once :attr:`failure` is.
        self.lost = trio.Event()
        #: The engine's last scheduler figures (None until a step sent some).
        self.scheduler_stats: codec.SchedulerStats | None = None
        #: Called with each step's scheduler figures, in the output owner task.
        self.on_stats: Callable[[codec.SchedulerStats], None] | None = None
        #: Called with the number of tokens each outputs message carried (when any), in
        #: the output owner task.
        self.on_tokens: Callable[[int], None] | None = None
        #: Called after each pass of the output owner that read something: the outputs
        #: of every step that was waiting have been handed to their sinks (a sink may hold
        #: a stream's outputs until then, to write several steps' in one go).
        self.on_pass_end: Callable[[], None] | None = None
        #: Outputs for requests this client did not know (each answered with an ABORT).
        self.unknown_outputs = 0
        #: Outputs for requests this client had just aborted (dropped: one ABORT is enough).
        self.late_outputs = 0
        self._recent_aborts: dict[str, None] = {}
        #: Requests the engine reported finished (``finished_requests``): its own count of
        #: ends, aborts included.
        self.finished_in_engine = 0
        self._cancel_scope: trio.CancelScope | None = None

    # -- requests ----------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests added and not yet ended."""
        return len(self._sinks)

    def add(self, request: codec.EngineCoreRequest, sink: OutputSink) -> None:
        """Send ``request`` (its ``client_index`` set to this client's) and register
        ``sink`` for its outputs. Never waits. Raises :class:`EngineLostError` once the
        engine is lost, :class:`EngineOverloadedError` if the engine takes nothing more,
        ``ValueError`` for a request id already in flight here."""
        if self.failure is not None:
            raise EngineLostError(self.failure)
        request_id = request.request_id
        if request_id in self._sinks:
            raise ValueError(f"request {request_id!r} is already in flight")
        request.client_index = self.client_index
        if not self._input.send([self._identity, *codec.encode_add(request)]):
            raise EngineOverloadedError("the engine's input queue is full")
        self._sinks[request_id] = sink

    def abort(self, request_ids: Sequence[str]) -> None:
        """Abort these requests in the engine and forget their sinks: nothing more reaches
        them (the engine answers an ABORT with nothing). Never waits; ids this client does
        not know are sent anyway (the engine ignores them)."""
        recent = self._recent_aborts
        for request_id in request_ids:
            if self._sinks.pop(request_id, None) is not None:
                recent[request_id] = None
        while len(recent) > RECENT_ABORTS:
            del recent[next(iter(recent))]
        if self.failure is not None or not request_ids:
            return
        self._aborts.extend(request_ids)
        self._input.wake()  # sent as one ABORT in the owner's next flush pass

    def _flush_aborts(self) -> None:
        if self._aborts:
            ids, self._aborts = self._aborts, []
            if not self._input.send([self._identity, *codec.encode_abort(ids)]):
                # The outbox is full: the engine does not read. Keep them for the next
                # pass; the heartbeat decides whether the engine is lost.
                self._aborts[:0] = ids

    # -- utility calls -------------------------------------------------------------------

    async def call_utility(self, method: str, *args: Any, timeout: float) -> Any:
        """EngineCore's ``method(*args)``, its result once the engine answers. Raises
        :class:`EngineCallError` with the engine's message if the call failed there,
        ``trio.TooSlowError`` after ``timeout`` seconds, :class:`EngineLostError` if the
        engine is lost meanwhile."""
        if self.failure is not None:
            raise EngineLostError(self.failure)
        call_id = next(self._call_ids)
        call = self._calls[call_id] = _Call()
        try:
            frames = codec.encode_utility(self.client_index, call_id, method, args)
            if not self._input.send([self._identity, *frames]):
                raise EngineOverloadedError("the engine's input queue is full")
            with trio.fail_after(timeout):
                await call.done.wait()
        finally:
            self._calls.pop(call_id, None)
        if call.failure is not None:
            raise EngineLostError(call.failure) if call.lost else EngineCallError(call.failure)
        return call.value

    # -- what the owner tasks call -------------------------------------------------------

    def _on_outputs(self, frames: list[bytes]) -> None:
        try:
            message = codec.decode_outputs(frames)
        except EngineLostError as exc:
            self._die(str(exc))
            return
        except PeerProtocolError as exc:
            # The outputs of a whole step are lost with it: no request can end right.
            self._die(f"the engine sent a message this trioserve cannot read: {exc}")
            return
        sinks = self._sinks
        unknown: list[str] = []
        tokens = 0
        for output in message.outputs:
            tokens += len(output.new_token_ids)
            sink = sinks.get(output.request_id)
            if sink is None:
                if output.request_id in self._recent_aborts:
                    self.late_outputs += 1
                    if output.finish_reason is not None:
                        del self._recent_aborts[output.request_id]
                    continue
                if output.finish_reason is None:
                    unknown.append(output.request_id)
                self.unknown_outputs += 1
                continue
            if output.finish_reason is not None:
                del sinks[output.request_id]
            try:
                sink.output(output, message.timestamp)
            except Exception:  # a bug in one request's sink ends that request only
                log.exception("ending request %s: its output sink failed", output.request_id)
                if sinks.pop(output.request_id, None) is not None:
                    unknown.append(output.request_id)
        if message.finished_requests:
            self.finished_in_engine += len(message.finished_requests)
            for request_id in message.finished_requests:
                # Finished in the engine with no final output for us: ended all the same.
                sink = sinks.pop(request_id, None)
                if sink is not None:
                    ended = codec.EngineCoreOutput(
                        request_id, [], finish_reason=codec.FinishReason.ABORT
                    )
                    with _barrier(request_id):
                        sink.output(ended, message.timestamp)
        if unknown:
            self._aborts.extend(unknown)
            self._input.wake()
        if tokens and self.on_tokens is not None:
            self.on_tokens(tokens)
        if message.utility_output is not None:
            self._on_utility(message.utility_output)
        stats = message.scheduler_stats
        if stats is not None:
            self.scheduler_stats = stats
            if self.on_stats is not None:
                with _barrier("scheduler figures"):
                    self.on_stats(stats)

    def _on_utility(self, answer: codec.UtilityOutput) -> None:
        call = self._calls.get(answer.call_id)
        if call is None:
            return  # its caller gave up (timed out, cancelled)
        call.failure = answer.failure_message
        if call.failure is None:
            try:
                call.value = answer.value
            except PeerProtocolError as exc:
                call.failure = str(exc)
        call.done.set()

    def _on_monitor(self, socket_name: str, frames: list[bytes]) -> None:
        event = monitor_event(frames)
        if event == zmq.EVENT_DISCONNECTED:
            self._die(f"the engine closed its connection to this client's {socket_name} socket")

    def lose(self, reason: str) -> None:
        """Declare the engine lost, for an owner that knows before the sockets do (its
        process exited): as when the client notices it itself."""
        self._die(reason)

    def _die(self, reason: str) -> None:
        """The engine is lost: every request in flight ends now, once, with ``reason``."""
        if self.failure is not None:
            return
        self.failure = reason
        log.error("vLLM's EngineCore is lost: %s", reason)
        sinks, self._sinks = self._sinks, {}
        for request_id, sink in sinks.items():
            with _barrier(request_id):
                sink.lost(reason)
        for call in self._calls.values():
            call.failure, call.lost = reason, True
            call.done.set()
        self._aborts.clear()
        self.lost.set()
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    async def _heartbeat(self, interval: float, timeout: float) -> None:
        while True:
            await trio.sleep(interval)
            try:
                await self.call_utility(HEARTBEAT_METHOD, timeout=timeout)
            except trio.TooSlowError:
                self._die(f"the engine did not answer a heartbeat within {timeout:g} s")
            except EngineCallError as exc:
                self._die(f"the engine failed a heartbeat: {exc}")
            except EngineOverloadedError:
                self._die("the engine stopped reading its input (its queue is full)")
            except EngineLostError:
                return


@attrs.define
class _Call:
    done: trio.Event = attrs.Factory(trio.Event)
    value: Any = None
    failure: str | None = None
    lost: bool = False


@contextlib.contextmanager
def _barrier(what: str) -> Any:
    try:
        yield
    except Exception:
        log.exception("a callback for %s failed", what)


@contextlib.asynccontextmanager
async def open_enginecore_client(
    pairs: Sequence[ClientAddresses],
    client_index: int = 0,
    *,
    handshake: str | None = None,
    on_handshake_bound: Callable[[str], None] | None = None,
    known: codec.EngineCoreReadyResponse | None = None,
    load_timeout: float = LOAD_TIMEOUT,
    heartbeat_interval: float = HEARTBEAT_INTERVAL,
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
    outbox_limit: int = 16_384,
) -> AsyncIterator[EngineCoreClient]:
    """Bind client ``client_index``'s sockets (``pairs[client_index]``) and yield a client
    once the engine is ready and connected.

    ``pairs`` lists every client of the engine by ``client_index``: with ``handshake`` (an
    address such as ``tcp://127.0.0.1:PORT``, the engine started with
    ``--data-parallel-address 127.0.0.1 --data-parallel-rpc-port PORT``), this client does
    the handshake and hands the engine all of them; the others open their clients with the
    same ``pairs`` and no handshake, before or after. (``tcp://HOST:*`` binds a free port:
    ``on_handshake_bound`` is called with the address bound, before the engine is waited
    for, e.g. to start it.) With ``known``, the engine was ready
    before (this is a client binding its addresses again): it only waits for the engine to
    connect. An engine of a vLLM release the codec does not mirror is refused with
    :class:`ProtocolVersionError`, one that breaks the handshake with
    :class:`PeerProtocolError`; one that is not ready within ``load_timeout`` seconds
    raises ``trio.TooSlowError``.

    On exit the sockets close (aborting nothing: the caller ends its requests first). When
    the engine is lost the body is cancelled and :class:`EngineLostError` is raised.
    """
    own = pairs[client_index]
    ctx = zmq.Context()
    sockets: list[zmq.Socket[bytes]] = []
    try:
        input_sock = client_socket(ctx, zmq.ROUTER)
        sockets.append(input_sock)
        output_sock = client_socket(ctx, zmq.PULL)
        sockets.append(output_sock)
        # The monitors before the binds: an engine already connecting (a rejoin, the
        # engine started first) may be through its handshake as soon as a socket is
        # bound, and a handshake the monitor missed was waited for until load_timeout.
        monitors = {
            "input": input_sock.get_monitor_socket(_MONITOR_EVENTS),
            "output": output_sock.get_monitor_socket(_MONITOR_EVENTS),
        }
        sockets.extend(monitors.values())
        pairs = list(pairs)
        # (A tcp "*" port, resolved.)
        pairs[client_index] = ClientAddresses(
            bind(input_sock, own.input), bind(output_sock, own.output)
        )
        opening = Opening()
        opening.ready = known
        client: EngineCoreClient | None = None

        def on_input(frames: list[bytes]) -> None:
            # Only the registration comes in on the input socket.
            try:
                if len(frames) != 2:
                    raise PeerProtocolError(f"{len(frames)} frames on the input socket")
                response = codec.decode_ready_response(frames[1])
            except (PeerProtocolError, ProtocolVersionError) as exc:
                if client is None:
                    opening.fail(exc)
                else:
                    log.warning("ignoring a message on the input socket: %s", exc)
                return
            if opening.ready is None:
                opening.ready = response
            opening.registered.set()

        early: list[list[bytes]] = []

        def on_output(frames: list[bytes]) -> None:
            if client is None:
                # Outputs before the client is made: a rejoin's, for a previous client's
                # requests (answered with ABORTs once it is). Bounded.
                early.append(frames)
                del early[:-64]
            else:
                client._on_outputs(frames)

        def on_monitor(name: str, frames: list[bytes]) -> None:
            if monitor_event(frames) == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                opening.connected[name].set()
            elif client is not None:
                client._on_monitor(name, frames)

        def on_pass_end() -> None:
            if client is not None and client.on_pass_end is not None:
                with _barrier("the end of an output pass"):
                    client.on_pass_end()

        input_pump = ZmqPump(input_sock, on_input, outbox_limit=outbox_limit)
        output_pump = ZmqPump(output_sock, on_output, after_receive=on_pass_end)
        monitor_pumps = [
            ZmqPump(sock, functools.partial(on_monitor, name)) for name, sock in monitors.items()
        ]
        failed: BaseException | None = None
        async with trio.open_nursery() as nursery:
            for pump in (input_pump, output_pump, *monitor_pumps):
                nursery.start_soon(pump.run)
            try:
                with trio.fail_after(load_timeout):
                    if handshake is not None:
                        await handshake_with(
                            ctx,
                            handshake,
                            [pair.input for pair in pairs],
                            [pair.output for pair in pairs],
                            opening,
                            on_handshake_bound,
                        )
                    if known is None:
                        await opening.until(opening.registered)
                    for event in opening.connected.values():
                        await opening.until(event)
            except (trio.TooSlowError, PeerProtocolError, ProtocolVersionError, OSError) as exc:
                failed = exc
                nursery.cancel_scope.cancel()
            else:
                assert opening.ready is not None  # registered (or known)
                client = EngineCoreClient(opening.ready, client_index, input_pump, outbox_limit)
                input_pump._before_flush = client._flush_aborts
                for frames in early:
                    client._on_outputs(frames)
                early.clear()
                nursery.start_soon(client._heartbeat, heartbeat_interval, heartbeat_timeout)
                client._cancel_scope = nursery.cancel_scope
                log.info(
                    "connected to vLLM %s's EngineCore as client %d (max_model_len %d)",
                    client.ready.vllm_version,
                    client_index,
                    client.ready.max_model_len,
                )
                try:
                    yield client
                finally:
                    nursery.cancel_scope.cancel()
        if failed is not None:
            raise failed
        if client is not None and client.failure is not None:
            raise EngineLostError(client.failure)
    finally:
        for sock in sockets:
            sock.close(linger=0)
        ctx.destroy(linger=0)

"""A stand-in for vLLM's EngineCore on real ZeroMQ, for what a real engine does not do on
demand: an ERROR output mid-stream, outputs for a request the client never sent,
``ENGINE_CORE_DEAD``, heartbeats left unanswered.

It connects to one client's sockets as EngineCore does (a DEALER whose identity is its
data-parallel rank, ``b"\\x00\\x00"``, to the input ROUTER; a PUSH to the output PULL),
registers with a ready response, answers utility calls (the client's heartbeat) until told
to stop, records every ADD and ABORT, and sends the outputs the test makes. The frames are
the codec's structs encoded with msgspec, as vLLM encodes them
(tests/vllm/test_enginecore_codec.py holds the codec to vLLM's own).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgspec
import trio
import zmq

from tests.helpers.waiting import HANG_GUARD
from trioserve.enginecore import codec
from trioserve.enginecore.client import ClientAddresses
from trioserve.transport.zmq_pump import ZmqPump

READY = codec.EngineCoreReadyResponse(
    max_model_len=512,
    num_gpu_blocks=32,
    block_size=16,
    dp_stats_address=None,
    dtype="float32",
    vllm_version="0.32.0",
    world_size=1,
    data_parallel_size=1,
    tensor_parallel_size=1,
    pipeline_parallel_size=1,
    decode_context_parallel_size=1,
    data_parallel_rank=0,
    max_num_seqs=8,
    max_num_batched_tokens=512,
    instance_id="fake",
    supports_lora=False,
    max_loras=0,
)


class FakeEngineCore:
    """One fake engine connected to one client (made by :func:`open_fake_enginecore`)."""

    def __init__(self, input_pump: ZmqPump, output: zmq.Socket[bytes]) -> None:
        self._input = input_pump
        # Only ever sent on, by the test's task (no task waits on its descriptor).
        self._output = output
        #: Every request added, by id, in order.
        self.added: dict[str, codec.EngineCoreRequest] = {}
        #: Every request id of every ABORT, in order.
        self.aborted: list[str] = []
        #: False: utility calls (heartbeats) go unanswered, as from a hung engine.
        self.answer_utilities = True
        self._changed = trio.Event()

    def on_input(self, frames: list[bytes]) -> None:
        kind, payload = frames[0], frames[1]
        if kind == codec.RequestType.ADD.value:
            request = codec.decode_request(frames[1:])
            self.added[request.request_id] = request
        elif kind == codec.RequestType.ABORT.value:
            self.aborted.extend(msgspec.msgpack.decode(payload))
        elif kind == codec.RequestType.UTILITY.value and self.answer_utilities:
            _client_index, call_id, _method, _args = msgspec.msgpack.decode(payload)
            answer = codec.UtilityOutput(call_id, None, [None, ["generate"]])
            self.send(codec.EngineCoreOutputs(utility_output=answer))
        self._changed.set()
        self._changed = trio.Event()

    def send(self, outputs: codec.EngineCoreOutputs) -> None:
        """One message on the client's output socket."""
        self._output.send(msgspec.msgpack.encode(outputs), zmq.NOBLOCK)

    def step(self, *outputs: codec.EngineCoreOutput) -> None:
        """One engine step's outputs, with its ``finished_requests`` as vLLM fills them."""
        finished = [o.request_id for o in outputs if o.finish_reason is not None]
        self.send(
            codec.EngineCoreOutputs(outputs=list(outputs), finished_requests=finished or None)
        )

    def send_dead(self) -> None:
        self._output.send(codec.ENGINE_CORE_DEAD, zmq.NOBLOCK)

    async def until_added(self, count: int) -> list[str]:
        """The ids of the first ``count`` requests, once they have been added."""
        with trio.fail_after(HANG_GUARD):
            while len(self.added) < count:
                await self._changed.wait()
        return list(self.added)[:count]

    async def until_aborted(self, request_id: str) -> None:
        with trio.fail_after(HANG_GUARD):
            while request_id not in self.aborted:
                await self._changed.wait()


@contextlib.asynccontextmanager
async def open_fake_enginecore(
    pair: ClientAddresses, ready: codec.EngineCoreReadyResponse = READY
) -> AsyncIterator[FakeEngineCore]:
    """A fake engine connected to ``pair`` (the client may bind before or after), having
    sent its ready response (``ready``)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    input_sock = ctx.socket(zmq.DEALER)
    output_sock = ctx.socket(zmq.PUSH)
    try:
        for sock in (input_sock, output_sock):
            sock.setsockopt(zmq.LINGER, 0)
        input_sock.setsockopt(zmq.IDENTITY, READY.data_parallel_rank.to_bytes(2, "little"))
        input_sock.connect(pair.input)
        output_sock.connect(pair.output)
        fake: FakeEngineCore | None = None

        def on_input(frames: list[bytes]) -> None:
            assert fake is not None
            fake.on_input(frames)

        input_pump = ZmqPump(input_sock, on_input)
        fake = FakeEngineCore(input_pump, output_sock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(input_pump.run)
            input_pump.send([codec.encode_ready_response(ready)])
            yield fake
            nursery.cancel_scope.cancel()
    finally:
        input_sock.close(linger=0)
        output_sock.close(linger=0)
        ctx.destroy(linger=0)


@contextlib.asynccontextmanager
async def attach_fake_enginecore(
    handshake: str, ready: codec.EngineCoreReadyResponse = READY
) -> AsyncIterator[FakeEngineCore]:
    """A fake engine that finds its client as a headless vLLM engine started elsewhere
    does: ``HELLO`` on the client's handshake socket at ``handshake``, the client's
    addresses in its answer, then the ready response on them and ``READY``. Leaving the
    context closes its sockets, as an engine that died."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(handshake)
    told: list[list[bytes]] = []
    answered = trio.Event()

    def on_message(frames: list[bytes]) -> None:
        told.append(frames)
        answered.set()

    pump = ZmqPump(sock, on_message)
    status = {"local": False, "headless": True}
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump.run)
            pump.send([msgspec.msgpack.encode({"status": "HELLO", **status})])
            with trio.fail_after(HANG_GUARD):
                await answered.wait()
            init = msgspec.msgpack.decode(told[0][-1])
            addresses = init["addresses"]
            pair = ClientAddresses(addresses["inputs"][0], addresses["outputs"][0])
            async with open_fake_enginecore(pair, ready) as fake:
                pump.send([msgspec.msgpack.encode({"status": "READY", **status})])
                yield fake
            nursery.cancel_scope.cancel()
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)

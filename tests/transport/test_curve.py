"""CURVE on the engine link, over real sockets: the frontend's own CurveZMQ client
(ZmtpDealer) against libzmq's CURVE server (a pyzmq ROUTER with ``curve_server``, and the
SDK's engines behind ``bound_router``'s ZAP handler), then end to end through the
frontend to the mock engine."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import pytest
import trio
import zmq
from nacl import bindings as sodium

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.transport import check_many_senders
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.engine_programs.mock import MockBackend
from trioserve.sdk import TrioEngine, serve_engine
from trioserve.transport import zmtp
from trioserve.transport.curve import CurveClientKeys
from trioserve.transport.keys import CurveServerKeys, write_keypair
from trioserve.transport.zmq_pump import ZmqPump, bind_router, bound_router
from trioserve.transport.zmtp import ZmtpDealer

IDENTITY = b"frontend-curve"
PROMPT = "the secret plans for the annual picnic"


def keypair() -> tuple[bytes, bytes]:
    return sodium.crypto_box_keypair()


class Keys:
    """An engine's pair, an authorized frontend's pair, and a stranger's."""

    def __init__(self) -> None:
        self.engine_public, self.engine_secret = keypair()
        self.frontend_public, self.frontend_secret = keypair()
        self.stranger_public, self.stranger_secret = keypair()

    def server(self) -> CurveServerKeys:
        return CurveServerKeys(
            public=self.engine_public,
            secret=self.engine_secret,
            authorized=frozenset({self.frontend_public}),
        )

    def client(self, *, stranger: bool = False, server: bytes | None = None) -> CurveClientKeys:
        public, secret = (
            (self.stranger_public, self.stranger_secret)
            if stranger
            else (self.frontend_public, self.frontend_secret)
        )
        return CurveClientKeys(public=public, secret=secret, server=server or self.engine_public)


async def start_curve_engine(
    nursery: trio.Nursery, curve: CurveServerKeys, tokens_per_second: float = 400.0
) -> TrioEngine:
    backend = MockBackend(tokens_per_second=tokens_per_second, ttft_ms=2.0)
    return await nursery.start(
        partial(serve_engine, backend, "tcp://127.0.0.1:*", track_ends=True, curve=curve)
    )


async def recv(peer: zmq.Socket) -> list[bytes]:
    with trio.fail_after(HANG_GUARD):
        while True:
            try:
                return peer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                await trio.sleep(0.005)


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


# -- the dealer against libzmq --------------------------------------------------------------


async def test_messages_both_ways_under_curve_with_libzmq_heartbeats(nursery, ctx):
    keys = Keys()
    peer = ctx.socket(zmq.ROUTER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.CURVE_SERVER, 1)
    peer.setsockopt(zmq.CURVE_SECRETKEY, keys.engine_secret)
    # libzmq pings every 20 ms (boxed commands, under CURVE) and drops a connection
    # silent for 100 ms: only boxed PONGs keep an idle one up.
    peer.setsockopt(zmq.HEARTBEAT_IVL, 20)
    peer.setsockopt(zmq.HEARTBEAT_TIMEOUT, 100)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    heard: list[list[bytes]] = []
    dealer = ZmtpDealer(f"tcp://127.0.0.1:{port}", IDENTITY, heard.append, curve=keys.client())
    nursery.start_soon(dealer.run)
    big = bytes(range(256)) * 4096  # 1 MiB: long frames, many reads
    assert dealer.send([b"hello"])  # queued before the connection: encoded once it is up
    assert await recv(peer) == [IDENTITY, b"hello"]
    assert dealer.send([b"a", b"", big])
    assert await recv(peer) == [IDENTITY, b"a", b"", big]
    peer.send_multipart([IDENTITY, b"x" * 300])
    peer.send_multipart([IDENTITY, b"one", b"two"])
    peer.send_multipart([IDENTITY, big])
    await wait_until(lambda: len(heard) == 3, "three replies")
    assert heard == [[b"x" * 300], [b"one", b"two"], [big]]
    await trio.sleep(0.6)  # thirty of libzmq's pings
    assert dealer.send([b"still here"])
    assert await recv(peer) == [IDENTITY, b"still here"]
    assert dealer.connections == 1
    nursery.cancel_scope.cancel()


async def test_many_senders_in_order_and_every_reply_heard_under_curve(nursery):
    # Nonces in order both ways while senders in many tasks send, the owner parks, and a
    # libzmq echo answers each: every message is the next one, none lost.
    keys = Keys()
    with bound_router(None, "tcp://127.0.0.1:*", curve=keys.server()) as echo:
        echo_pump = ZmqPump(echo, lambda frames: echo_pump.send(frames))
        nursery.start_soon(echo_pump.run)
        heard: list[bytes] = []
        dealer = ZmtpDealer(
            echo.getsockopt_string(zmq.LAST_ENDPOINT),
            IDENTITY,
            lambda frames: heard.append(frames[0]),
            curve=keys.client(),
        )
        nursery.start_soon(dealer.run)
        await check_many_senders(lambda body: dealer.send([body]), heard)
        assert dealer.connections == 1
        nursery.cancel_scope.cancel()


async def test_the_engines_zap_handler_admits_authorized_keys_only(nursery, caplog):
    keys = Keys()
    with bound_router(None, "tcp://127.0.0.1:*", curve=keys.server()) as peer:
        address = peer.getsockopt_string(zmq.LAST_ENDPOINT)
        errors: list[str] = []

        def on_error(why: str) -> float:
            errors.append(why)
            return 0.05

        stranger = ZmtpDealer(
            address,
            b"stranger",
            lambda f: None,
            on_error=on_error,
            curve=keys.client(stranger=True),
        )
        friend = ZmtpDealer(address, IDENTITY, lambda f: None, curve=keys.client())
        nursery.start_soon(stranger.run)
        nursery.start_soon(friend.run)
        assert stranger.send([b"let me in"])
        assert friend.send([b"hello"])
        with caplog.at_level(logging.WARNING):
            assert await recv(peer) == [IDENTITY, b"hello"]
            await wait_until(lambda: len(errors) >= 3, "three refusals")
        assert all("refused this frontend's CURVE key" in why for why in errors)
        assert "--curve-authorized-keys" in errors[0]
        assert stranger.connections == 0 and not stranger.connected
        # The engine says so, once per key, not once per attempt.
        refusals = [r for r in caplog.records if "not in --curve-authorized-keys" in r.message]
        assert len(refusals) == 1
        with pytest.raises(zmq.Again):
            peer.recv_multipart(zmq.NOBLOCK)  # nothing of the stranger's got through
        nursery.cancel_scope.cancel()


async def test_a_curve_engine_without_its_zap_handler_refuses_every_key(nursery, ctx):
    # ZMQ_ZAP_ENFORCE_DOMAIN: without a handler, libzmq would let any key in.
    keys = Keys()
    peer = bind_router(ctx, "tcp://127.0.0.1:*", curve=keys.server())
    errors: list[str] = []

    def on_error(why: str) -> float:
        errors.append(why)
        return 0.05

    dealer = ZmtpDealer(
        peer.getsockopt_string(zmq.LAST_ENDPOINT),
        IDENTITY,
        lambda f: None,
        on_error=on_error,
        curve=keys.client(),
    )
    nursery.start_soon(dealer.run)
    await wait_until(lambda: len(errors) >= 2, "refusals")
    assert dealer.connections == 0
    peer.close(linger=0)
    nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("wrong-server-key", "is not the one the engine uses"),
        ("null-engine", "it never falls back to clear text"),
        ("null-frontend", "requires a security mechanism (CURVE): give this frontend"),
    ],
)
async def test_a_mismatch_fails_the_handshake_with_a_line_that_says_which(
    nursery, ctx, setup, expected
):
    keys = Keys()
    if setup == "null-engine":
        peer = bind_router(ctx, "tcp://127.0.0.1:*")
        curve: CurveClientKeys | None = keys.client()
    else:
        peer = bind_router(ctx, "tcp://127.0.0.1:*", curve=keys.server())
        other, _ = keypair()
        curve = keys.client(server=other) if setup == "wrong-server-key" else None
    errors: list[str] = []

    def on_error(why: str) -> float:
        errors.append(why)
        return 0.05

    dealer = ZmtpDealer(
        peer.getsockopt_string(zmq.LAST_ENDPOINT),
        IDENTITY,
        lambda f: None,
        on_error=on_error,
        curve=curve,
    )
    nursery.start_soon(dealer.run)
    assert dealer.send([b"never delivered"])
    await wait_until(lambda: len(errors) >= 2, "two failed handshakes")
    assert expected in errors[0] and errors[0] == errors[1]
    assert dealer.connections == 0
    with pytest.raises(zmq.Again):
        peer.recv_multipart(zmq.NOBLOCK)
    peer.close(linger=0)
    nursery.cancel_scope.cancel()


# -- end to end, through the frontend -------------------------------------------------------


class Relay:
    """A TCP relay between the frontend and the engine that records what passes, and can
    change a byte of what the engine sends (the attacker of issue 17)."""

    def __init__(self, target: str, tamper: Callable[[bytearray], None] | None = None) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.tamper = tamper
        self.to_engine = bytearray()
        self.to_frontend = bytearray()
        self.address = ""

    async def serve(self, task_status: trio.TaskStatus[None]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.address = f"tcp://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, frontend: trio.SocketStream) -> None:
        engine = await trio.open_tcp_stream(*self.target)

        async def pump(src, dst, record: bytearray, tamper) -> None:
            try:
                while data := await src.receive_some(65536):
                    start = len(record)
                    record += data
                    if tamper is not None:
                        tamper(record)
                    await dst.send_all(bytes(record[start:]))
            except trio.BrokenResourceError:
                pass
            finally:
                await dst.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, frontend, engine, self.to_engine, None)
            nursery.start_soon(pump, engine, frontend, self.to_frontend, self.tamper)


async def curve_frontend(nursery, tmp_path, address: str, keys: Keys, **settings):
    (tmp_path / "frontend.key_secret").write_text(
        f"{_z85(keys.frontend_secret)}\n", encoding="ascii"
    )
    (tmp_path / "frontend.key_secret").chmod(0o600)
    (tmp_path / "engine.key").write_text(f"{_z85(keys.engine_public)}\n", encoding="ascii")
    return await start_frontend(
        nursery,
        None,
        server="builtin",
        engines=[address],
        engine_curve_secret_key=str(tmp_path / "frontend.key_secret"),
        engine_curve_server_key=str(tmp_path / "engine.key"),
        **settings,
    )


def _z85(key: bytes) -> str:
    from trioserve.transport.keys import z85_encode

    return z85_encode(key)


def chat(max_tokens: int = 8) -> dict:
    return {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens}


async def test_a_request_is_served_end_to_end_over_curve_and_the_wire_shows_no_prompt(
    nursery, tmp_path
):
    keys = Keys()
    engine = await start_curve_engine(nursery, keys.server())
    relay = Relay(engine.address)
    await nursery.start(relay.serve)
    frontend = await curve_frontend(nursery, tmp_path, relay.address, keys)
    async with frontend.client() as client:
        reply = await client.post("/v1/chat/completions", json=chat())
        assert reply.status_code == 200
        text = reply.json()["choices"][0]["message"]["content"]
        streamed = await client.post("/v1/chat/completions", json={**chat(), "stream": True})
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert text and engine.stats.finished == 2
    wire = bytes(relay.to_engine + relay.to_frontend)
    assert b"CURVE" in wire[:64]  # it is the engine link...
    assert PROMPT.encode() not in wire  # ...and nothing of the request in clear text
    assert b"picnic" not in wire and text.encode() not in wire
    assert b"frontend-" not in wire  # our identity travels in INITIATE's box
    nursery.cancel_scope.cancel()


async def test_without_curve_the_same_relay_reads_the_prompt(nursery):
    # The control for the test above: a relay that sees a NULL link sees everything.
    engine = await start_engine(nursery)
    relay = Relay(engine.address)
    await nursery.start(relay.serve)
    frontend = await start_frontend(nursery, None, server="builtin", engines=[relay.address])
    async with frontend.client() as client:
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200
    assert PROMPT.encode() in bytes(relay.to_engine)
    nursery.cancel_scope.cancel()


async def test_an_answer_altered_on_the_way_is_refused_not_delivered(nursery, tmp_path, caplog):
    keys = Keys()
    engine = await start_curve_engine(nursery, keys.server(), tokens_per_second=50.0)
    flipped = []

    def flip_one_byte_after_the_handshake(record: bytearray) -> None:
        # Past greeting, WELCOME and READY (under 400 bytes) and the welcome message:
        # the first byte of a later engine message is changed once.
        if not flipped and len(record) > 2000:
            record[-1] ^= 0x01
            flipped.append(len(record))

    relay = Relay(engine.address, flip_one_byte_after_the_handshake)
    await nursery.start(relay.serve)
    frontend = await curve_frontend(nursery, tmp_path, relay.address, keys)
    async with frontend.client() as client:
        with caplog.at_level(logging.ERROR, logger="trioserve.links.protocol"):
            reply = await client.post(
                "/v1/chat/completions", json={**chat(max_tokens=400), "stream": True}
            )
        await wait_until(lambda: bool(flipped), "the relay to change a byte")
    # The stream ends with an error event (the engine failed), and what was delivered
    # is what the engine sent: the mock's text, with no altered byte in it.
    assert "engine_failed" in reply.text or "engine_lost" in reply.text
    assert "does not authenticate" in caplog.text
    nursery.cancel_scope.cancel()


async def test_a_frontend_whose_key_is_not_authorized_is_refused_and_stays_unready(
    nursery, tmp_path, caplog
):
    keys = Keys()
    seen: list[bytes] = []
    engine = await start_curve_engine(nursery, keys.server())
    handle = engine.core.handle

    def spy(identity: bytes, frame: bytes, now: float):
        seen.append(identity)
        return handle(identity, frame, now)

    engine.core.handle = spy  # type: ignore[method-assign]
    keys.frontend_public, keys.frontend_secret = keys.stranger_public, keys.stranger_secret
    with caplog.at_level(logging.INFO):
        frontend = await curve_frontend(nursery, tmp_path, engine.address, keys)
    failures = frontend.app.services.engines.failures()
    assert list(failures) == [engine.address]
    assert "refused this frontend's CURVE key" in failures[engine.address]
    assert f"engine {engine.address} failed" in caplog.text
    async with frontend.client() as client:
        assert (await client.get("/health")).status_code == 503
        reply = await client.post("/v1/chat/completions", json=chat())
        assert reply.status_code == 503
    assert seen == []  # not one frame of this frontend's reached the engine
    assert engine.stats.submitted == 0
    nursery.cancel_scope.cancel()


async def test_frontend_keys_from_keygen_files(nursery, tmp_path):
    # The files `trioserve keygen` writes, as the frontend and the engine read them.
    from trioserve.transport.keys import client_keys, server_keys

    _, frontend_secret = write_keypair(tmp_path / "frontend")
    engine_public, engine_secret = write_keypair(tmp_path / "engine")
    server = server_keys(engine_secret, tmp_path / "frontend.key")
    engine = await start_curve_engine(nursery, server)
    frontend = await start_frontend(
        nursery,
        None,
        server="builtin",
        engines=[engine.address],
        engine_curve_secret_key=frontend_secret,
        engine_curve_server_key=engine_public,
    )
    assert client_keys(frontend_secret, engine_public).public in server.authorized
    async with frontend.client() as client:
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200
    nursery.cancel_scope.cancel()


def test_reconnects_take_fresh_short_term_keys():
    keys = Keys()
    dealer = ZmtpDealer("tcp://127.0.0.1:9", IDENTITY, lambda f: None, curve=keys.client())
    assert dealer.curve is not None
    first = zmtp.CurveClient(dealer.curve)
    second = zmtp.CurveClient(dealer.curve)
    assert first._short_public != second._short_public

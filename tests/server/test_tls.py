"""TLS and mutual TLS on both servers, with certificates made here (trustme) and real
clients: httpx, the official openai client, trio-websocket, and raw sockets."""

from __future__ import annotations

import datetime
import json
import logging
import ssl

import httpx
import openai
import pytest
import trio
import trustme
from trio_websocket import open_websocket_url

from tests.helpers.frontends import SERVERS, start_engine, start_frontend
from tests.helpers.http import read_to_end, wait_health
from tests.helpers.http1 import EchoApp, get, serve
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.cli import main
from trioserve.config import Settings
from trioserve.engine_programs.mock import expected_text
from trioserve.server import tls

CHAT = {"model": "mock", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}
LONG = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 100_000, "stream": True}


class Certificates:
    """A CA, the server's certificate from it, and PEM files for the server's options."""

    def __init__(self, tmp_path) -> None:
        self.ca = trustme.CA()
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.certfile = tmp_path / "server.pem"
        self.certfile.write_bytes(b"".join(pem.bytes() for pem in server.cert_chain_pems))
        self.keyfile = tmp_path / "server.key"
        server.private_key_pem.write_to_path(str(self.keyfile))
        self.ca_certs = tmp_path / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_certs))

    def server_options(self, **mtls: str) -> dict[str, str]:
        return {"ssl_certfile": str(self.certfile), "ssl_keyfile": str(self.keyfile), **mtls}

    def client_context(self, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
        """A client's context: trusts the test CA; presents ``cert`` if given."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if cert is not None:
            cert.configure_cert(context)
        return context


@pytest.fixture
def certs(tmp_path) -> Certificates:
    return Certificates(tmp_path)


async def tls_frontend(nursery, engine, certs: Certificates, server: str, **mtls: str):
    frontend = await start_frontend(nursery, engine, server=server, **certs.server_options(**mtls))
    assert frontend.url.startswith("https://")
    return frontend


def client(frontend, context: ssl.SSLContext, **options: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=frontend.url, timeout=HANG_GUARD, verify=context, **options)


async def served(frontend, context: ssl.SSLContext) -> bool:
    async with client(frontend, context) as http:
        return (await http.get("/health")).status_code == 200


def no_tracebacks(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.mark.parametrize("http_server", SERVERS)
async def test_json_and_sse_over_tls(nursery, engine, certs, http_server):
    frontend = await tls_frontend(nursery, engine, certs, http_server)
    async with client(frontend, certs.client_context()) as http:
        answer = await http.post("/v1/chat/completions", json=CHAT)
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"] == expected_text("hello there", 5)
        stream = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert stream.status_code == 200
    events = [e.removeprefix("data: ") for e in stream.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == expected_text("hello there", 5)


@pytest.mark.parametrize("http_server", SERVERS)
async def test_http2_through_alpn_on_hypercorn_and_http1_on_our_server(
    nursery, engine, certs, http_server
):
    frontend = await tls_frontend(nursery, engine, certs, http_server)
    async with client(frontend, certs.client_context(), http2=True) as http:
        answer = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
    assert answer.http_version == ("HTTP/2" if http_server == "hypercorn" else "HTTP/1.1")


async def test_official_openai_client_over_tls(nursery, engine, certs):
    frontend = await tls_frontend(nursery, engine, certs, "builtin")
    http = httpx.AsyncClient(verify=certs.client_context(), timeout=HANG_GUARD)
    async with openai.AsyncOpenAI(
        base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0, http_client=http
    ) as api:
        answer = await api.chat.completions.create(**CHAT)
        assert answer.choices[0].message.content == expected_text("hello there", 5)
        text = ""
        async for chunk in await api.chat.completions.create(**CHAT, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
    assert text == expected_text("hello there", 5)


async def test_websocket_over_tls(nursery, engine, certs):
    frontend = await tls_frontend(nursery, engine, certs, "builtin")
    url = frontend.url.replace("https://", "wss://") + "/v1/ws"
    request = {
        "type": "request",
        "id": "a",
        "endpoint": "completions",
        "body": {"prompt": "hello", "max_tokens": 5},
    }
    text = ""
    async with open_websocket_url(url, ssl_context=certs.client_context()) as ws:
        await ws.send_message(json.dumps(request))
        with trio.fail_after(HANG_GUARD):
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                text += message["data"]["choices"][0]["text"]
    assert message["type"] == "done"
    assert text == expected_text("hello", 5)


async def tls_stream(frontend, context: ssl.SSLContext) -> trio.SSLStream:
    host, port = frontend.url.removeprefix("https://").rsplit(":", 1)
    return await trio.open_ssl_over_tcp_stream(host, int(port), ssl_context=context)


async def test_disconnect_mid_stream_over_tls_aborts_the_engine_request(nursery, engine, certs):
    # After its first token the engine goes quiet and no keepalive is written: only the
    # server's hang-up watcher (epoll on the socket) can notice the client leave. TLS
    # changes nothing at the TCP level, where a hang-up shows.
    frontend = await start_frontend(
        nursery, engine, server="builtin", sse_keepalive=0, **certs.server_options()
    )
    context = certs.client_context()
    stream = await tls_stream(frontend, context)
    body = json.dumps({**LONG, "mock_hang_after": 1}).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"x-request-id: tls1\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    await stream.send_all(head + body)
    received = b""
    with trio.fail_after(HANG_GUARD):
        while b"data: " not in received:
            received += await stream.receive_some()
    assert received.startswith(b"HTTP/1.1 200")
    await stream.aclose()
    await wait_until(lambda: frontend.ends("tls1"), "the engine to see tls1 end")
    assert frontend.ends("tls1") == ["aborted"]
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "no request in flight")
    assert frontend.engine.core.stats.unknown_aborts == 0  # never a second abort
    assert await served(frontend, context)


@pytest.mark.parametrize("http_server", SERVERS)
async def test_plain_http_to_the_tls_port_is_refused_and_the_server_goes_on(
    nursery, engine, certs, http_server, caplog
):
    frontend = await tls_frontend(nursery, engine, certs, http_server)
    host, port = frontend.url.removeprefix("https://").rsplit(":", 1)
    caplog.set_level(logging.INFO)
    with trio.fail_after(HANG_GUARD):
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = b""
        try:
            while chunk := await stream.receive_some():
                answer += chunk
        except trio.BrokenResourceError:
            pass  # a reset
        await stream.aclose()
    assert b"HTTP/1.1" not in answer  # no answer in clear text, whatever the alert
    assert await served(frontend, certs.client_context())
    if http_server == "builtin":
        assert any("TLS handshake" in r.getMessage() for r in caplog.records)
        no_tracebacks(caplog)


def expired(ca: trustme.CA) -> trustme.LeafCert:
    now = datetime.datetime.now(datetime.UTC)
    return ca.issue_cert(
        "client.example",
        not_before=now - datetime.timedelta(days=2),
        not_after=now - datetime.timedelta(days=1),
    )


async def refused(frontend, context: ssl.SSLContext) -> bool:
    """The server refuses this client's TLS: the request fails at the transport (with
    TLS 1.3 the client learns it on its first read, from the server's alert)."""
    try:
        await served(frontend, context)
    except httpx.TransportError:
        return True
    return False


@pytest.mark.parametrize("http_server", SERVERS)
async def test_mtls_required_refuses_missing_untrusted_and_expired_certificates(
    nursery, engine, certs, http_server, caplog
):
    frontend = await tls_frontend(
        nursery, engine, certs, http_server, ssl_ca_certs=str(certs.ca_certs)
    )
    caplog.set_level(logging.INFO)
    stranger = trustme.CA().issue_cert("client.example")
    assert await refused(frontend, certs.client_context())
    assert await refused(frontend, certs.client_context(stranger))
    assert await refused(frontend, certs.client_context(expired(certs.ca)))
    good = certs.client_context(certs.ca.issue_cert("client.example"))
    assert await served(frontend, good)
    async with client(frontend, good) as http:
        answer = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert answer.text.endswith("data: [DONE]\n\n")
    if http_server == "builtin":
        failed = [r for r in caplog.records if "TLS handshake" in r.getMessage()]
        assert len(failed) == 3
        no_tracebacks(caplog)


@pytest.mark.parametrize("http_server", SERVERS)
async def test_mtls_optional_serves_clients_without_a_certificate(
    nursery, engine, certs, http_server
):
    frontend = await tls_frontend(
        nursery,
        engine,
        certs,
        http_server,
        ssl_ca_certs=str(certs.ca_certs),
        ssl_client_cert="optional",
    )
    assert await served(frontend, certs.client_context())
    assert await served(frontend, certs.client_context(certs.ca.issue_cert("client.example")))
    # A certificate that is presented is still checked.
    assert await refused(frontend, certs.client_context(trustme.CA().issue_cert("c.example")))


async def test_past_max_connections_a_tls_client_gets_its_503_and_a_probe_its_answer(
    nursery, certs
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server="builtin", max_connections=1, **certs.server_options()
    )
    context = certs.client_context()
    holder = await tls_stream(frontend, context)  # takes the one connection
    await holder.do_handshake()
    for path, status in (("/v1/models", b"503"), ("/live", b"200"), ("/health", b"200")):
        extra = await tls_stream(frontend, context)  # at the door: it shakes hands there
        await extra.send_all(get(path))
        with trio.fail_after(HANG_GUARD):
            data = await read_to_end(extra)
        assert data.startswith(b"HTTP/1.1 " + status), data
        if status == b"503":
            assert b'"too_many_connections"' in data
    await holder.aclose()
    async with client(frontend, context, limits=httpx.Limits(max_connections=1)) as http:
        await wait_health(http)  # the held connection's slot frees when the server sees it close


# -- the built-in server's bounds over TLS ---------------------------------------------


async def serve_tls(
    nursery, certs: Certificates, app=None, **config: object
) -> tuple[int, trio.Event]:
    """The built-in server alone (``app``, an ``EchoApp`` if none) over TLS."""
    context = tls.server_context(Settings(**certs.server_options()))  # type: ignore[arg-type]
    return await serve(nursery, app, ssl_context=context, **config)


async def closed_by_server(stream: trio.abc.Stream) -> bool:
    with trio.fail_after(HANG_GUARD):
        try:
            return await stream.receive_some() == b""
        except trio.BrokenResourceError:
            return True


async def test_a_handshake_that_never_ends_is_dropped_at_the_header_timeout(nursery, certs, caplog):
    port, _ = await serve_tls(nursery, certs, header_timeout=0.2)
    caplog.set_level(logging.INFO)
    silent = await trio.open_tcp_stream("127.0.0.1", port)  # and never says hello
    assert await closed_by_server(silent)
    assert any("within the header timeout" in r.getMessage() for r in caplog.records)
    stream = await trio.open_ssl_over_tcp_stream(
        "127.0.0.1", port, ssl_context=certs.client_context()
    )
    await stream.send_all(get("/after"))
    assert b'"/after"' in await stream.receive_some()


async def test_a_tls_client_that_stops_reading_is_dropped_and_reported_gone(nursery, certs):
    app = EchoApp()
    port, _ = await serve_tls(nursery, certs, app, write_timeout=0.2)
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SSLStream(
        trio.SocketStream(sock), certs.client_context(), server_hostname="127.0.0.1"
    )
    await stream.send_all(get("/stream"))
    # Never read: the server's write times out, it closes, and the app hears of it.
    await wait_until(lambda: app.disconnects == 1, "the app to see the drop")
    await stream.transport_stream.aclose()


async def test_stop_accepting_closes_idle_tls_connections(nursery, certs):
    port, stop = await serve_tls(nursery, certs)
    idle = await trio.open_ssl_over_tcp_stream(
        "127.0.0.1", port, ssl_context=certs.client_context()
    )
    await idle.send_all(get("/"))
    assert b'"/"' in await idle.receive_some()
    stop.set()
    assert await closed_by_server(idle)


# -- the command line -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make_args", "status", "message"),
    [
        # Options that do not go together: a usage error, status 2.
        (lambda c: ["--ssl-certfile", str(c.certfile)], 2, "--ssl-certfile and --ssl-keyfile go"),
        (lambda c: ["--ssl-keyfile", str(c.keyfile)], 2, "--ssl-certfile and --ssl-keyfile go"),
        # Files that cannot be used: the environment's fault, status 1.
        (
            lambda c: ["--ssl-certfile", str(c.certfile), "--ssl-keyfile", "/nonexistent.pem"],
            1,
            "--ssl-keyfile /nonexistent.pem: No such file",
        ),
        (
            lambda c: ["--ssl-certfile", str(c.keyfile), "--ssl-keyfile", str(c.keyfile)],
            1,
            "cannot be used",
        ),
        (lambda c: ["--ssl-ca-certs", str(c.ca_certs)], 2, "--ssl-ca-certs (mutual TLS) needs"),
        (
            lambda c: [
                *("--ssl-certfile", str(c.certfile), "--ssl-keyfile", str(c.keyfile)),
                *("--ssl-client-cert", "optional"),
            ],
            2,
            "--ssl-client-cert needs --ssl-ca-certs",
        ),
    ],
)
def test_unusable_tls_options_are_a_clear_error_not_a_traceback(
    certs, caplog, make_args, status, message
):
    assert main(["run", *make_args(certs)]) == status
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and message in errors[0].getMessage()
    assert not errors[0].exc_info


async def test_http2_streams_share_their_connection_s_place_in_its_key_s_share(
    nursery, engine, certs
):
    # Under hypercorn's HTTP/2 a connection carries many streams: they all count as the one
    # connection of their key. Another connection of a key at its share is refused 429 on
    # its stream, without the Connection header HTTP/2 forbids (h2 refused to send such a
    # head: the 401 of a body sent without a key too), and may still serve another key.
    # A body refused from its head does not end the connection (its DATA frames, for a
    # stream hypercorn had forgotten, were a KeyError that closed it).
    frontend = await start_frontend(
        nursery,
        engine,
        server="hypercorn",
        api_keys=["ka", "kb"],
        max_connections_per_key=1,
        **certs.server_options(),
    )
    ka, kb = ({"authorization": f"Bearer {key}"} for key in ("ka", "kb"))
    async with client(frontend, certs.client_context(), http2=True) as first:
        answers = []

        async def get_models() -> None:
            answers.append(await first.get("/v1/models", headers=ka))

        async with trio.open_nursery() as streams:
            for _ in range(3):
                streams.start_soon(get_models)
        assert [(a.status_code, a.http_version) for a in answers] == [(200, "HTTP/2")] * 3
        async with client(frontend, certs.client_context(), http2=True) as second:
            refused = await second.get("/v1/models", headers=ka)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "too_many_connections_for_key"
            assert "connection" not in refused.headers
            # Past a stream's flow-control window: its DATA frames come after the 401.
            body = {"prompt": "x" * 300_000}
            keyless = await second.post("/v1/completions", json=body)
            assert keyless.status_code == 401, keyless.text
            assert (await second.get("/v1/models", headers=kb)).status_code == 200
        assert (await first.get("/v1/models", headers=ka)).status_code == 200

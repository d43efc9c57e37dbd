"""The built-in server's settings and limits."""

from __future__ import annotations

import logging

import attrs

from ...config import default_max_connections

__all__ = ["Http1Config", "default_max_connections"]

log = logging.getLogger("trioserve.http1")


RECEIVE_SIZE = 65536
#: Bytes of a pipelined next request buffered while a response is in progress; past it the
#: server stops reading that connection until the response is done.
PIPELINE_BUFFER = 65536
#: Connections past ``max_connections`` held at the door at once: each is given a moment
#: to send its request head, so that a probe (``probe_paths``) is still answered and
#: anything else reads its 503 rather than a reset; past it, further ones get the 503
#: and are closed at once.
TURN_AWAY_LINGERING = 64
#: Seconds a connection at the door is given to send its request head (and, over TLS,
#: to shake hands first).
TURN_AWAY_LINGER = 1.0
#: Seconds between two log lines about connections refused or accept(2) failing.
LOG_INTERVAL = 10.0
#: Seconds the accept loop waits after accept(2) ran out of descriptors or memory.
ACCEPT_BACKOFF = 0.1
#: After an early answer (a body not read), how long and how much of the body the server
#: still reads off before it closes (nginx's lingering close).
LINGER_SECONDS = 2.0
LINGER_BYTES = 1024 * 1024


@attrs.define
class Http1Config:
    #: Largest request head (request line + headers), bytes.
    max_header_bytes: int = 16 * 1024
    #: Seconds to receive a whole request head once its first byte arrived.
    header_timeout: float = 10.0
    #: Seconds an idle keep-alive connection stays open.
    keep_alive_timeout: float = 5.0
    #: Seconds one socket write may take before the connection is dropped.
    write_timeout: float = 30.0
    ws_max_message_bytes: int = 1024 * 1024
    #: Seconds between WebSocket pings (0: none).
    ws_ping_interval: float = 20.0
    #: Seconds from a request head to the end of its body (408 past it; 0: no limit).
    body_deadline: float = 120.0
    #: Connections open at once; past it, a new one is answered 503 and closed (0: three
    #: quarters of the process's descriptor limit, see :func:`default_max_connections`).
    max_connections: int = 0
    #: Paths answered (GET or HEAD) even past ``max_connections``: the liveness and
    #: readiness probes, which must not fail because clients hold every slot.
    probe_paths: frozenset[str] = frozenset()
    #: Connections one API key may hold (0: no bound per key). The application names a
    #: connection's key (``hold_for_key``) once it has authenticated a request on it.
    max_connections_per_key: int = 0

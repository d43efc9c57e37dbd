"""What an operator sees of the requests: metrics, traces and the access log.

The request lifecycle tells an :class:`Observer` when each engine request begins and when
it has ended (``lifecycle.Observer``); the application tells it when each client request
has been answered (:meth:`Observer.http_done`, and for a WebSocket
:meth:`Observer.ws_request_done` per request and :meth:`Observer.ws_socket_done` for the
socket). Everything it records is read from the request's :class:`RequestHandle` and its
subscription, which keep their figures per write of outputs; nothing here runs per token.

The access log (logger ``trioserve.access``, INFO): one line per client request, every
route (404s too), every request on a WebSocket and the socket itself. In text form::

    127.0.0.1:50312 "POST /v1/chat/completions HTTP/1.1" 200 1834B 0.153s ttft=0.021s
    tokens=5/16 end=completed id=0af3...

(one line; ``-`` where a figure does not apply; ``key=LABEL`` at the end when the request
came with an API key: its label from the key file, or ``key-N``, never the key); with
``--log-format json`` the same fields are keys of the JSON line (``logs.py``).

Traces (``--otlp-traces-endpoint``) are ``tracing.py``'s, imported only then.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

from .. import metrics
from ..ends import Ending, EndReason, Outcome
from ..protocol import Submit
from .exchange import Exchange
from .lifecycle import Endable, RequestHandle

if TYPE_CHECKING:
    from .tracing import Tracing

log = logging.getLogger("trioserve.request")
ACCESS = logging.getLogger("trioserve.access")

#: Methods counted under their own name in ``trioserve_http_requests_total`` (any other:
#: ``other``, so that a client cannot make up label values).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "WS"})
#: The status of a request whose client left before a response began (nginx's).
CLIENT_CLOSED = 499
#: Longest path written to the access log (longer ones are cut).
MAX_LOGGED_PATH = 512
#: The WebSocket route's path (its metric label; any other handshake path is ``unmatched``).
WEBSOCKET_ROUTE = "/v1/ws"


class Observer:
    """Metrics, traces and the access log of one application (see the module docstring).

    ``tracing``: a ``tracing.Tracing`` (OpenTelemetry), or None for no traces.
    """

    def __init__(
        self,
        *,
        access_log: bool = True,
        tracing: Tracing | None = None,
        key_labels: list[str] | None = None,
    ) -> None:
        self.access_log = access_log
        self.tracing = tracing
        #: What each API key (by index) is called: its label, never the key.
        self.key_labels = key_labels or []

    def key_label(self, key_index: int | None) -> str | None:
        """The label of key ``key_index`` (None: no key)."""
        if key_index is None:
            return None
        labels = self.key_labels
        return labels[key_index] if key_index < len(labels) else f"key-{key_index + 1}"

    # -- engine requests (lifecycle.Observer) -------------------------------------------

    def begin(self, handle: RequestHandle, submit: Submit) -> Submit:
        handle.submit = submit
        if self.tracing is not None:
            submit = self.tracing.begin(handle, submit)
        return submit

    def submitted(self, handle: RequestHandle) -> None:
        assert handle.sub is not None and handle.submit is not None
        handle.sub.gaps = metrics.INTER_TOKEN_LATENCY.labels(
            handle.submit.model, handle.route
        ).observe

    def ended(self, handle: RequestHandle, outcome: Ending) -> None:
        now = perf_counter()
        submit = handle.submit
        model = submit.model if submit is not None else ""
        route = handle.route
        metrics.requests_ended(model, route, outcome).inc()
        metrics.REQUEST_DURATION.labels(model, route, outcome).observe(now - handle.arrived)
        sub = handle.sub
        if sub is not None and sub.outputs:
            metrics.TIME_TO_FIRST_TOKEN.labels(model, route).observe(
                sub.first_output_at - handle.arrived
            )
        final = sub.final if sub is not None else None
        usage = final.usage if final is not None else None
        prompt_tokens, generation_tokens = metrics.tokens(model, route)
        if usage is not None:
            prompt_tokens.inc(usage.prompt_tokens)
            generation_tokens.inc(usage.completion_tokens)
            if outcome is Outcome.COMPLETED and usage.completion_tokens > 1 and sub is not None:
                metrics.TIME_PER_OUTPUT_TOKEN.labels(model, route).observe(
                    (sub.last_output_at - sub.first_output_at) / (usage.completion_tokens - 1)
                )
        elif sub is not None and sub.outputs:
            generation_tokens.inc(sub.outputs)
        if final is not None and final.queue_time is not None:
            metrics.QUEUE_TIME.labels(model).observe(final.queue_time)
        if outcome not in (Outcome.COMPLETED, EndReason.DISCONNECT):
            log.info("request %s ended: %s", handle.id, outcome)
        if self.tracing is not None and handle.trace is not None:
            self.tracing.end(handle, outcome, now)

    # -- client requests -------------------------------------------------------------------

    def http_done(self, exchange: Exchange, route: str, gone: bool) -> None:
        """An HTTP request has been answered (or its client left): its status in the
        metrics and its access log line. ``route``: the route's path, ``unmatched`` for
        none; ``gone``: the client left while the app read or answered it."""
        figures = _figures(exchange.handle)
        end = figures[3]
        gone = gone or end == EndReason.DISCONNECT
        status = exchange.status or (CLIENT_CLOSED if gone else 500)
        method = exchange.method
        metrics.http_requests(route, method if method in METHODS else "other", status).inc()
        if gone:
            metrics.client_disconnects(route).inc()
        if self.access_log and ACCESS.isEnabledFor(logging.INFO):
            head = exchange.head
            self._access(
                client=head.client,
                method=method,
                path=exchange.path,
                protocol=f"HTTP/{head.http_version}",
                status=status,
                sent=exchange.sent,
                duration=perf_counter() - exchange.arrived,
                figures=figures,
                request_id=exchange.request_id,
                key=self.key_label(exchange.key_index),
            )

    def ws_request_done(
        self,
        *,
        client: tuple[str, int] | None,
        socket: int,
        endpoint: str,
        status: int,
        sent: int,
        arrived: float,
        handle: Endable | None,
        request_id: str,
    ) -> None:
        """A request on a WebSocket is over (or was refused: no ``handle``); ``handle``
        a request's or, for ``n`` > 1, its group's."""
        figures = _figures(handle)
        gone = figures[3] == EndReason.DISCONNECT
        metrics.http_requests("/v1/ws", "WS", status).inc()
        if gone:
            metrics.client_disconnects("/v1/ws").inc()
        if self.access_log and ACCESS.isEnabledFor(logging.INFO):
            self._access(
                client=client,
                method="WS",
                path="/v1/ws",
                protocol=endpoint,
                status=status,
                sent=sent,
                duration=perf_counter() - arrived,
                figures=figures,
                request_id=request_id,
                extra={"socket": socket},
                key=self.key_label(handle.owner if handle is not None else None),
            )

    def ws_socket_done(
        self,
        *,
        client: tuple[str, int] | None,
        socket: int | None,
        status: int,
        sent: int,
        arrived: float,
        end: str,
        requests: int,
        path: str = WEBSOCKET_ROUTE,
    ) -> None:
        """A WebSocket handshake on ``path`` has been refused (``status`` its answer), or an
        accepted socket (101) has closed: ``end`` says how, ``requests`` how many it
        carried. A handshake on another path than the WebSocket route's is counted under
        route ``unmatched``, as an HTTP request on a made-up path is."""
        route = WEBSOCKET_ROUTE if path == WEBSOCKET_ROUTE else "unmatched"
        metrics.http_requests(route, "GET", status).inc()
        if self.access_log and ACCESS.isEnabledFor(logging.INFO):
            self._access(
                client=client,
                method="GET",
                path=_loggable(path),
                protocol="HTTP/1.1",
                status=status,
                sent=sent,
                duration=perf_counter() - arrived,
                figures=(None, None, None, end),
                request_id=None,
                extra={"socket": socket, "requests": requests},
            )

    def _access(
        self,
        *,
        client: tuple[str, int] | None,
        method: str,
        path: str,
        protocol: str,
        status: int,
        sent: int,
        duration: float,
        figures: tuple[float | None, int | None, int | None, str | None],
        request_id: str | None,
        extra: Mapping[str, Any] | None = None,
        key: str | None = None,
    ) -> None:
        ttft, prompt, completion, end = figures
        address = f"{client[0]}:{client[1]}" if client else "-"
        path = _loggable(path)
        fields: dict[str, Any] = {
            "client": address,
            "method": method,
            "path": path,
            "protocol": protocol,
            "status": status,
            "bytes": sent,
            "duration": round(duration, 6),
            "ttft": None if ttft is None else round(ttft, 6),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "end": end,
            "request_id": request_id,
            "key": key,
        }
        tokens = "-" if prompt is None and completion is None else f"{_n(prompt)}/{_n(completion)}"
        line = (
            f'{address} "{method} {path} {protocol}" {status} {sent}B {duration:.3f}s '
            f"ttft={'-' if ttft is None else f'{ttft:.3f}s'} tokens={tokens} "
            f"end={end or '-'} id={request_id or '-'}"
        )
        if key is not None:
            line += f" key={_loggable(key)}"
        if extra:
            fields.update(extra)
            line += "".join(f" {key}={value}" for key, value in extra.items())
        ACCESS.info(line, extra={"access": fields})


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def _loggable(path: str) -> str:
    """The path as one safe token of a log line: no control characters or quotes (a
    percent-decoded path may hold a newline), at most :data:`MAX_LOGGED_PATH` long."""
    if len(path) > MAX_LOGGED_PATH:
        path = path[:MAX_LOGGED_PATH] + "..."
    if not path.isprintable() or '"' in path:
        path = path.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return path


def _figures(handle: Any) -> tuple[float | None, int | None, int | None, str | None]:
    """(time to first token, prompt tokens, generated tokens, how it ended) of a client
    request's engine request, or of a fan-out group's members together; all None for a
    request that ran none."""
    if handle is None:
        return None, None, None, None
    if isinstance(handle, RequestHandle):
        return (*_tokens([handle]), handle.outcome or handle.end_reason)
    members: list[RequestHandle] = getattr(handle, "members", [])
    outcomes = {m.outcome for m in members}
    end = handle.end_reason
    if end is None:
        failed = sorted(
            o for o in outcomes if o not in (None, Outcome.COMPLETED, EndReason.ABANDONED)
        )
        end = (
            failed[0]
            if failed
            else (Outcome.COMPLETED if outcomes == {Outcome.COMPLETED} else None)
        )
    return (*_tokens(members), end)


def _tokens(handles: list[RequestHandle]) -> tuple[float | None, int | None, int | None]:
    ttft: float | None = None
    prompt: int | None = None
    completion: int | None = None
    for handle in handles:
        sub = handle.sub
        if sub is None:
            continue
        if sub.outputs:
            first = sub.first_output_at - handle.arrived
            ttft = first if ttft is None else min(ttft, first)
        usage = sub.final.usage if sub.final is not None else None
        if usage is not None:
            # The prompt is counted once for n choices (as the response's usage is).
            prompt = usage.prompt_tokens
            completion = (completion or 0) + usage.completion_tokens
        elif sub.outputs:
            completion = (completion or 0) + sub.outputs
    return ttft, prompt, completion

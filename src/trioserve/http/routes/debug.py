"""``GET /debug/requests``: the live view of the requests in flight (``--debug-endpoints``).

Each request's place in its lifecycle, read from the registry's handles and their
subscriptions when asked (nothing is recorded for it): JSON, or with ``?format=html`` a
page that refreshes itself. WebSocket requests are listed under their socket. See
docs/cancellation.md.
"""

from __future__ import annotations

import html
import math
from time import perf_counter
from typing import Any
from urllib.parse import parse_qs

import trio

from ..errors import HTTPError
from ..exchange import Exchange
from ..lifecycle import RequestHandle
from ..openapi.content import Doc
from ..services import Services
from .route import Route, Routes

#: Seconds between two refreshes of the HTML page.
REFRESH_SECONDS = 2


async def requests_in_flight(services: Services, exchange: Exchange) -> None:
    query = parse_qs(exchange.head.query_string.decode("latin-1"))
    fmt = query.get("format", ["json"])[-1]
    if fmt not in ("json", "html"):
        raise HTTPError(400, "format must be json or html", "invalid_format")
    view = snapshot(services)
    if fmt == "json":
        await exchange.respond_json(200, view)
        return
    page = render_html(view).encode()
    await exchange.respond(
        200,
        page,
        [(b"content-type", b"text/html; charset=utf-8"), (b"cache-control", b"no-store")],
    )


def snapshot(services: Services) -> dict[str, Any]:
    """Every request in flight, HTTP ones in ``requests``, WebSocket ones in ``sockets``
    (each socket with its requests), oldest first."""
    now = perf_counter()
    clock = trio.current_time()
    handles = [h for h in services.registry.handles() if isinstance(h, RequestHandle)]
    handles.sort(key=lambda h: h.arrived)
    by_socket: dict[int, list[dict[str, Any]]] = {}
    requests = []
    for handle in handles:
        entry = describe(handle, now, clock)
        entry["key"] = services.observer.key_label(handle.owner)
        if handle.socket is None:
            requests.append(entry)
        else:
            by_socket.setdefault(handle.socket, []).append(entry)
    sockets = []
    for connection in sorted(services.connections, key=lambda c: c.opened):
        sockets.append(
            {
                "socket": connection.number,
                "client": _address(connection.client),
                "age_s": round(now - connection.opened, 3),
                "requests": by_socket.pop(connection.number, []),
            }
        )
    for number, entries in by_socket.items():  # (a socket closing as we look)
        sockets.append({"socket": number, "client": None, "age_s": None, "requests": entries})
    return {
        "in_flight": len(handles),
        "requests": requests,
        "sockets": sockets,
    }


def describe(handle: RequestHandle, now: float, clock: float) -> dict[str, Any]:
    sub = handle.sub
    submit = handle.submit
    deadline = handle.scope.deadline
    return {
        "id": handle.id,
        "route": handle.route,
        "model": submit.model if submit is not None else None,
        "engine": getattr(sub.engine, "address", None) if sub is not None else None,
        "client": _address(handle.client),
        "transport": handle.transport,
        "socket": handle.socket,
        "group": handle.group,
        "phase": handle.phase,
        "end_reason": handle.end_reason,
        "age_s": round(now - handle.arrived, 3),
        "deadline_left_s": None if math.isinf(deadline) else round(deadline - clock, 3),
        "outputs": sub.outputs if sub is not None else 0,
        "ttft_s": (
            round(sub.first_output_at - handle.arrived, 4)
            if sub is not None and sub.outputs
            else None
        ),
    }


def _address(client: tuple[str, int] | None) -> str | None:
    return f"{client[0]}:{client[1]}" if client else None


_COLUMNS = (
    "id",
    "route",
    "model",
    "engine",
    "client",
    "key",
    "transport",
    "group",
    "phase",
    "age_s",
    "deadline_left_s",
    "outputs",
    "ttft_s",
)


def render_html(view: dict[str, Any]) -> str:
    """The view as a page of its own (no external assets) that reloads itself."""

    def table(entries: list[dict[str, Any]]) -> str:
        if not entries:
            return "<p class=none>none</p>"
        head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
        rows = []
        for entry in entries:
            cells = "".join(
                f"<td class={'phase-' + str(entry['phase']) if c == 'phase' else c}>"
                f"{html.escape('-' if entry[c] is None else str(entry[c]))}</td>"
                for c in _COLUMNS
            )
            rows.append(f"<tr>{cells}</tr>")
        return f"<table><tr>{head}</tr>{''.join(rows)}</table>"

    parts = [
        "<!doctype html><html><head><meta charset=utf-8>",
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">',
        "<title>trioserve: requests in flight</title><style>",
        "body{font:13px system-ui,sans-serif;margin:1em}table{border-collapse:collapse}",
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#eee}",
        ".phase-waiting{background:#fff4cc}.phase-streaming{background:#e3f6e3}",
        ".phase-writing{background:#dde8ff}.phase-ending{background:#f6dede}",
        ".none{color:#888}</style></head><body>",
        f"<h1>Requests in flight: {view['in_flight']}</h1>",
        f"<p>Refreshes every {REFRESH_SECONDS} s. JSON: <code>?format=json</code>.</p>",
        "<h2>HTTP</h2>",
        table(view["requests"]),
        f"<h2>WebSocket ({len(view['sockets'])} open)</h2>",
    ]
    for socket in view["sockets"]:
        parts.append(
            f"<h3>socket {html.escape(str(socket['socket']))} from "
            f"{html.escape(str(socket['client']))}, open {html.escape(str(socket['age_s']))} s"
            "</h3>"
        )
        parts.append(table(socket["requests"]))
    parts.append("</body></html>")
    return "".join(parts)


# -- the routes ----------------------------------------------------------------------

#: Served only with ``--debug-endpoints`` (``table.py``).
DEBUG_ROUTES: Routes = {
    ("GET", "/debug/requests"): Route(
        requests_in_flight,
        Doc("debugRequests", "The requests in flight (--debug-endpoints)", "operations"),
    ),
}

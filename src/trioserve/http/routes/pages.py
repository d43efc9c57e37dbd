"""The pages: ``GET /`` (the playground, a page to chat with a model), ``GET /docs`` (the
API's documentation, read from ``/openapi.json``), ``GET /openapi.json`` itself, and the
pages' icon at ``GET /favicon.ico`` (browsers ask for it; a 404 there is noise in the
access log).

Each page is one packaged file (``http/assets/``): HTML with its script and style
inline, no build step, nothing fetched from elsewhere. Their Content-Security-Policy
allows exactly their own inline script and style (by hash) and connections back to this
server, so nothing injected into a page could run or send anything elsewhere.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib import resources

from ..errors import HTTPError
from ..exchange import JSON_HEADERS, Exchange
from ..openapi.content import JSON, Doc
from ..services import Services
from .route import Route, Routes

HTML = {"text/html": {"schema": {"type": "string"}}}
ICON = {"image/svg+xml": {"schema": {"type": "string"}}}

_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.DOTALL)


@functools.cache
def page(name: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The packaged page ``name`` and its response headers (read once)."""
    body = resources.files("trioserve.http").joinpath("assets", name).read_bytes()
    sources: dict[bytes, list[str]] = {b"script": [], b"style": []}
    for match in _INLINE.finditer(body):
        digest = base64.b64encode(hashlib.sha256(match.group(2)).digest()).decode()
        sources[match.group(1)].append(f"'sha256-{digest}'")
    scripts = " ".join(sources[b"script"]) or "'none'"
    styles = " ".join(sources[b"style"]) or "'none'"
    policy = (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-security-policy", policy.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cache-control", b"no-cache"),
    ]
    return body, headers


async def _serve(exchange: Exchange, name: str) -> None:
    body, headers = page(name)
    await exchange.respond(200, body, headers)


async def playground(services: Services, exchange: Exchange) -> None:
    if not services.settings.playground:  # --no-playground
        raise HTTPError(404, f"no route {exchange.method} {exchange.path}", "not_found")
    await _serve(exchange, "playground.html")


async def docs(services: Services, exchange: Exchange) -> None:
    await _serve(exchange, "docs.html")


async def openapi_json(services: Services, exchange: Exchange) -> None:
    assert services.openapi is not None  # set by the application
    await exchange.respond(200, services.openapi(), JSON_HEADERS)


@functools.cache
def _icon() -> bytes:
    return resources.files("trioserve.http").joinpath("assets", "favicon.svg").read_bytes()


async def favicon(services: Services, exchange: Exchange) -> None:
    await exchange.respond(
        200,
        _icon(),
        [
            (b"content-type", b"image/svg+xml"),
            (b"x-content-type-options", b"nosniff"),
            (b"cache-control", b"max-age=86400"),
        ],
    )


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("GET", "/openapi.json"): Route(
        openapi_json,
        Doc(
            "openapi",
            "This description of the API",
            "pages",
            ok={JSON: {"schema": {"type": "object"}}},
        ),
    ),
    ("GET", "/docs"): Route(
        docs,
        Doc("docs", "The API's documentation, to read and try", "pages", ok=HTML),
    ),
    ("GET", "/favicon.ico"): Route(
        favicon,
        Doc("favicon", "The pages' icon (SVG)", "pages", ok=ICON),
    ),
    ("GET", "/"): Route(
        playground,
        Doc(
            "playground",
            "A page to chat with a model (a 404 with --no-playground)",
            "pages",
            ok=HTML,
        ),
    ),
}

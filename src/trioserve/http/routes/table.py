"""The route table: every route module's routes, gathered, and which route serves a
method on a path (a fixed path, else a templated one, else the 405 or the 404).

Each route module ends with its own table (``ROUTES``; ``TEMPLATED`` for paths that hold
a parameter); the application (``app.py``) only dispatches on what is gathered here.
"""

from __future__ import annotations

import attrs

from ..errors import HTTPError
from ..exchange import Exchange
from . import (
    anthropic,
    debug,
    embeddings,
    generate,
    images,
    openai,
    operations,
    pages,
    responses,
    speech,
    tokenize,
    videos,
)
from .route import Route, Routes


def _gathered(*tables: Routes) -> Routes:
    """The tables as one; a (method, path) in two of them is a mistake, said at import."""
    gathered: Routes = {}
    for table in tables:
        twice = gathered.keys() & table.keys()
        if twice:
            raise ValueError(f"routes in two tables: {sorted(twice)}")
        gathered |= table
    return gathered


ROUTES = _gathered(
    openai.ROUTES,
    responses.ROUTES,
    anthropic.ROUTES,
    embeddings.ROUTES,
    generate.ROUTES,
    speech.ROUTES,
    images.ROUTES,
    videos.ROUTES,
    tokenize.ROUTES,
    operations.ROUTES,
    pages.ROUTES,
)
#: Routes whose path holds a parameter, ``{id}``: at least one character, "/" included
#: (model ids such as "org/name"), at the end of the path or before a fixed suffix
#: (``/v1/responses/{id}/cancel``).
TEMPLATED = _gathered(operations.TEMPLATED, responses.TEMPLATED)
#: Served only with ``--debug-endpoints`` (else unknown paths: 404), and not described in
#: ``/openapi.json``: an operator's view, not the API.
DEBUG_ROUTES = debug.DEBUG_ROUTES
PATHS = {path for _, path in ROUTES}
#: Paths whose every answer is in Anthropic's error shape (their 401 and 405 included).
ANTHROPIC_PATHS = {path for (_, path), route in ROUTES.items() if route.error_shape == "anthropic"}


@attrs.frozen
class Template:
    """A path of :data:`TEMPLATED`, split around its parameter."""

    method: str
    path: str
    prefix: str
    suffix: str
    route: Route

    def matches(self, path: str) -> bool:
        prefix, suffix = self.prefix, self.suffix
        return (
            len(path) > len(prefix) + len(suffix)
            and path.startswith(prefix)
            and path.endswith(suffix)
        )


def _template(method: str, path: str, route: Route) -> Template:
    prefix, _, suffix = path.partition("{id}")
    return Template(method, path, prefix, suffix, route)


#: The longest suffix first, so ``/v1/responses/x/cancel`` is the cancel of ``x``, not
#: ``x/cancel``.
_TEMPLATES = sorted(
    (_template(method, path, route) for (method, path), route in TEMPLATED.items()),
    key=lambda template: -len(template.suffix),
)


def templates(method: str, path: str) -> tuple[Template | None, list[Template]]:
    """The template that serves ``method`` on ``path`` (or None), and every template
    ``path`` matches."""
    matching = [template for template in _TEMPLATES if template.matches(path)]
    serving = next((t for t in matching if t.method == method), None)
    return serving, matching


def fallback(exchange: Exchange) -> Route:
    """A templated route (``/v1/models/{id}``), else the 405 or 404 for a path no route
    serves."""
    path = exchange.path
    serving, matching = templates(exchange.method, path)
    if serving is not None:
        return serving.route
    allowed = {m for m, p in ROUTES if p == path} | {t.method for t in matching}
    if allowed:
        raise HTTPError(
            405,
            f"method {exchange.method} not allowed on {path}",
            "method_not_allowed",
            headers=[(b"allow", ", ".join(sorted(allowed)).encode())],
        )
    raise HTTPError(404, f"no route {exchange.method} {path}", "not_found")

"""What a route is: its handler, what ``/openapi.json`` says of it, the engine capability
it needs and the shape of its errors. Each route module ends with its table of these
(``ROUTES``, and ``TEMPLATED`` for paths with a parameter); ``table.py`` gathers them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from ..exchange import Exchange
from ..openapi.content import Doc
from ..services import Services

RouteHandler = Callable[[Services, Exchange], Awaitable[None]]


@attrs.frozen
class Route:
    handler: RouteHandler
    #: What ``/openapi.json`` says about it (``openapi/``).
    doc: Doc
    #: The engine capability the route needs; generation routes take an admission slot.
    capability: str | None = None
    #: The shape of its errors (``Exchange.error_shape``): ``openai``, ``detail`` (the
    #: native ``{"detail": ...}``) or ``anthropic``.
    error_shape: str = "openai"


#: A route table: (method, path) -> route.
Routes = dict[tuple[str, str], Route]


def generation_doc(
    operation_id: str, summary: str, body: type, ok: dict[str, Any], **more: object
) -> Doc:
    """The :class:`Doc` of a generation route (tag ``generation``; it may end in any way of
    docs/api.md's "How a request can end")."""
    return Doc(operation_id, summary, "generation", body, ok=ok, generation=True, **more)  # type: ignore[arg-type]


#: What the text routes' descriptions say of where their answers come from.
NEEDS_TOKENIZER = (
    "Served from the model's text assets (an engine that takes token ids, or trioserve run "
    "--tokenizer PATH); without them, 501 tokenizer_unavailable."
)

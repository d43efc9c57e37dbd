"""The body of ``POST /v1/embeddings`` and the one engine request it becomes.

A batch (``input`` as a list) is one engine request carrying every input, not one
request per input: an embedding model embeds a batch in one forward pass, so the engine
should see the inputs together rather than as submits trickling in; and a client
request of 2,048 inputs stays one subscription, one admission slot, one registry entry
and at most one abort, instead of 2,048 of each. What that gives up: one client request
runs on one engine (a client that wants a batch spread over several engines sends
several requests). docs/protocol.md says how the engine answers.
"""

from __future__ import annotations

from typing import Any

import attrs

from ...protocol import Submit
from .validation import bounded, check_bounds, documented, invalid, structure

#: Inputs in one request (OpenAI's bound).
MAX_INPUTS = 2048
#: The largest ``dimensions`` a client may ask for.
MAX_DIMENSIONS = 65536
ENCODING_FORMATS = ("float", "base64")

_TEXT = {"type": "string", "minLength": 1}


@attrs.define
class EmbeddingRequest:
    input: Any = attrs.field(
        metadata={
            "schema": {
                "description": "a string, or a list of strings (a batch); token arrays are "
                "not accepted",
                "anyOf": [
                    _TEXT,
                    {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": MAX_INPUTS},
                ],
            }
        }
    )
    model: str | None = None
    encoding_format: str | None = documented(enum=list(ENCODING_FORMATS))
    dimensions: int | None = bounded(1, MAX_DIMENSIONS)
    user: str | None = None


#: Body fields that are the frontend's, not the engine's.
_NOT_PARAMS = frozenset(a.name for a in attrs.fields(EmbeddingRequest))


@attrs.frozen
class Embeddings:
    """A validated embeddings request."""

    submit: Submit
    #: How many embeddings the engine must send (one per input, in order).
    count: int
    encoding_format: str
    dimensions: int | None


def parse_embeddings(body: dict[str, Any], request_id: str, resolve_model: Any) -> Embeddings:
    """Validate ``body`` (422 :class:`~trioserve.http.errors.HTTPError` if bad) and
    translate it; ``resolve_model(requested: str | None) -> str`` picks the model."""
    req = structure(body, EmbeddingRequest)
    errors: list[dict[str, str]] = []
    check_bounds(req, errors)
    texts = req.input
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list):
        errors.append(
            {
                "loc": "$.input",
                "msg": "expected a string or a list of strings (token arrays are not accepted)",
            }
        )
    elif not texts:
        errors.append({"loc": "$.input", "msg": "at least one input is required"})
    elif len(texts) > MAX_INPUTS:
        errors.append({"loc": "$.input", "msg": f"at most {MAX_INPUTS} inputs"})
    else:
        single = isinstance(req.input, str)
        for i, text in enumerate(texts):
            loc = "$.input" if single else f"$.input[{i}]"
            if not isinstance(text, str):
                errors.append({"loc": loc, "msg": "expected a string"})
            elif not text:
                errors.append({"loc": loc, "msg": "must not be empty"})
    encoding = req.encoding_format or "float"
    if encoding not in ENCODING_FORMATS:
        errors.append(
            {"loc": "$.encoding_format", "msg": "must be one of " + ", ".join(ENCODING_FORMATS)}
        )
    if errors:
        raise invalid(errors)
    params = {k: v for k, v in body.items() if k not in _NOT_PARAMS}
    if req.dimensions is not None:
        params["dimensions"] = req.dimensions
    submit = Submit(request_id, resolve_model(req.model), "embedding", {"input": texts}, params)
    return Embeddings(submit, len(texts), encoding, req.dimensions)

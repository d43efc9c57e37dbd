"""Request bodies of the routes that take forms: JSON, urlencoded, or multipart with files.

``multipart/form-data`` is parsed as it arrives (python-multipart's streaming parser, fed
one ASGI body message at a time): file parts go straight to disk under the request's
upload directory (see :mod:`trioserve.http.bodies.uploads`), so the body limit is enforced while
the upload streams (413 mid-upload, without reading the rest); field values (not files)
are held in memory and counted in the body budget as they arrive (503 past it); and a
client that stops sending (408) or hangs up ends the request before anything reaches an
engine. Form values arrive as strings; the route's schema converts them (``"16"``,
``"true"``, ``"off"``).
"""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from ..errors import HTTPError
from ..exchange import Exchange, body_too_large
from ..memory import Holding, held_by
from .media import Media
from .uploads import Uploads, open_upload
from .validation import invalid, parse_json, structure

if TYPE_CHECKING:  # python-multipart defines its callback table for type checkers only
    from python_multipart.multipart import MultipartCallbacks

T = TypeVar("T")

JSON = "application/json"
URLENCODED = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"

#: Parts of one multipart body, fields of one urlencoded body (more is a 400).
MAX_PARTS = 1000
#: Largest non-file field of a multipart body, in bytes.
MAX_FIELD_BYTES = 1024 * 1024


@attrs.define
class Body:
    """A parsed request body: ``fields`` by name (JSON values, or strings for forms; the
    last of a repeated form field wins) and uploaded ``files`` by field name."""

    kind: str  # JSON, URLENCODED or MULTIPART
    fields: dict[str, Any]
    files: dict[str, list[Media]] = attrs.Factory(dict)
    #: Every uploaded file, in the order of the parts.
    uploads: list[Media] = attrs.Factory(list)

    @property
    def is_form(self) -> bool:
        return self.kind != JSON


def unsupported(content_type: str, accepted: tuple[str, ...]) -> HTTPError:
    return HTTPError(
        400,
        f"unsupported Content-Type {content_type or '(none)'!r}; this route accepts "
        + ", ".join(accepted),
        "unsupported_content_type",
    )


async def read_body(
    exchange: Exchange,
    *,
    limit: int,
    timeout: float,
    uploads: Uploads | None,
    accepted: tuple[str, ...] = (MULTIPART, URLENCODED, JSON),
) -> Body:
    """Read and parse the body by its Content-Type (400 naming ``accepted`` for others).

    Multipart file parts are written through ``uploads``; the caller owns it and removes
    the files when the request ends.
    """
    header = (exchange.header(b"content-type") or b"").decode("latin-1")
    essence, params = parse_options_header(header)
    kind = essence.decode("latin-1")
    if kind not in accepted:
        raise unsupported(header.strip(), accepted)
    if kind == MULTIPART:
        assert uploads is not None
        boundary = params.get(b"boundary")
        if not boundary:
            raise HTTPError(400, "a multipart body needs a boundary parameter", "invalid_form")
        return await _read_multipart(exchange, boundary, limit, timeout, uploads)
    raw = await exchange.read_body(limit, timeout)
    if kind == URLENCODED:
        try:
            pairs = urllib.parse.parse_qsl(
                raw.decode(), keep_blank_values=True, strict_parsing=False, max_num_fields=MAX_PARTS
            )
        except (UnicodeDecodeError, ValueError) as exc:
            raise HTTPError(400, f"malformed form body: {exc}", "invalid_form") from None
        return Body(kind, dict(pairs))
    value = parse_json(raw)
    exchange.memory.take(held_by(value))  # the parsed body, beside the bytes read
    if not isinstance(value, dict):
        raise invalid([{"loc": "$", "msg": "the body must be a JSON object"}])
    return Body(kind, value)


class _PartEvents:
    """python-multipart's callbacks, recorded; the async side acts on them between writes."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.ended = False
        self._field = bytearray()
        self._value = bytearray()
        self._headers: dict[str, str] = {}

    def callbacks(self) -> MultipartCallbacks:
        def on_header_field(data: bytes, start: int, end: int) -> None:
            self._field += data[start:end]

        def on_header_value(data: bytes, start: int, end: int) -> None:
            self._value += data[start:end]

        def on_header_end() -> None:
            self._headers[self._field.decode("latin-1").lower()] = self._value.decode("latin-1")
            self._field.clear()
            self._value.clear()

        def on_headers_finished() -> None:
            self.events.append(("headers", self._headers))
            self._headers = {}

        def on_part_data(data: bytes, start: int, end: int) -> None:
            self.events.append(("data", bytes(data[start:end])))

        def on_part_end() -> None:
            self.events.append(("end", None))

        def on_end() -> None:
            self.ended = True

        return {
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
            "on_end": on_end,
        }


async def _read_multipart(
    exchange: Exchange, boundary: bytes, limit: int, timeout: float, uploads: Uploads
) -> Body:
    exchange.check_declared_length(limit)
    recorder = _PartEvents()
    try:
        parser = MultipartParser(boundary, recorder.callbacks())
    except FormParserError as exc:
        raise HTTPError(400, f"malformed multipart body: {exc}", "invalid_form") from None
    body = Body(MULTIPART, {})
    state = _MultipartState(body, uploads, exchange.memory)
    size = 0
    try:
        while True:
            chunk, more = await exchange.next_body_chunk(timeout)
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            try:
                parser.write(chunk)
            except FormParserError as exc:
                raise HTTPError(400, f"malformed multipart body: {exc}", "invalid_form") from None
            events, recorder.events = recorder.events, []
            for event in events:
                await state.apply(*event)
            if not more:
                break
    finally:
        await state.close_file()
    if not (recorder.ended or parser.state == MultipartState.END):
        raise HTTPError(400, "the multipart body ended before its closing boundary", "invalid_form")
    return body


class _MultipartState:
    def __init__(self, body: Body, uploads: Uploads, memory: Holding) -> None:
        self.body = body
        self.uploads = uploads
        #: Field values are held in memory until the request ends: counted in the body
        #: budget as they arrive (files go to disk and count nothing).
        self.memory = memory
        self.parts = 0
        self.name = ""
        self.file: Any = None
        self.media: Media | None = None
        self.value: bytearray | None = None

    async def apply(self, kind: str, payload: Any) -> None:
        if kind == "headers":
            await self._begin(payload)
        elif kind == "data":
            if self.file is not None:
                await self.file.write(payload)
            elif self.value is not None:
                self.memory.take(len(payload))
                self.value += payload
                if len(self.value) > MAX_FIELD_BYTES:
                    raise HTTPError(
                        413,
                        f"form field {self.name!r} exceeds {MAX_FIELD_BYTES} bytes",
                        "field_too_large",
                    )
        else:
            await self._end()

    async def _begin(self, headers: dict[str, str]) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise HTTPError(400, f"more than {MAX_PARTS} form parts", "invalid_form")
        disposition, options = parse_options_header(headers.get("content-disposition"))
        name = options.get(b"name")
        if disposition != b"form-data" or name is None:
            raise HTTPError(
                400,
                "every form part needs Content-Disposition: form-data; name=...",
                "invalid_form",
            )
        self.name = name.decode("utf-8", "replace")
        filename = options.get(b"filename")
        if filename is None:
            self.value = bytearray()
            return
        content_type = headers.get("content-type", "application/octet-stream").strip()
        path = await self.uploads.new_file(filename.decode("utf-8", "replace"), content_type)
        self.file = await open_upload(path)
        modality = content_type.split("/")[0].lower()
        self.media = Media(
            modality if modality in ("image", "audio", "video") else "file",
            content_type.lower(),
            path=str(path),
            filename=path.name,
        )

    async def _end(self) -> None:
        if self.media is not None:
            await self.close_file()
            self.body.files.setdefault(self.name, []).append(self.media)
            self.body.uploads.append(self.media)
            self.media = None
        elif self.value is not None:
            try:
                self.body.fields[self.name] = self.value.decode()
            except UnicodeDecodeError:
                raise HTTPError(
                    400, f"form field {self.name!r} is not valid UTF-8", "invalid_form"
                ) from None
            self.value = None

    async def close_file(self) -> None:
        file, self.file = self.file, None
        if file is not None:
            await file.aclose()


def structure_fields(body: Body, cls: type[T]) -> T:
    """Structure ``body.fields`` into ``cls``: 422 for a JSON body, 400 for a form (whose
    values are strings: a value that does not parse is a bad request, not a bad schema)."""
    try:
        return structure(body.fields, cls)
    except HTTPError as error:
        raise _for_body(body, error) from None


def invalid_fields(body: Body, errors: list[dict[str, str]]) -> HTTPError:
    """The error for fields that parsed but break a rule, with the same 422/400 rule."""
    return _for_body(body, invalid(errors))


def _for_body(body: Body, error: HTTPError) -> HTTPError:
    if body.is_form and error.status == 422:
        error.status = 400
        error.type = "invalid_request_error"
    return error


def extra_params(body: Body, cls: type, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Body fields ``cls`` does not know: passed to the engine verbatim."""
    known = {a.name for a in attrs.fields(cls)} | exclude
    return {k: v for k, v in body.fields.items() if k not in known}

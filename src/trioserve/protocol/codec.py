"""Encode and decode engine-protocol frames: cattrs for shape, msgpack for bytes.

A frame is one ZeroMQ message part holding a msgpack array ``[tag, body]``: ``tag`` is a
string naming the message (see :data:`~trioserve.protocol.messages.TAGS`), ``body`` a map
of the message's fields. Fields whose value is nil/None may be left out. Unknown fields are
ignored, so a newer peer may add optional fields without a version bump.

Sans-io: no sockets, no event loop. :func:`decode` raises :class:`PeerProtocolError` on
anything it cannot turn into a message; peers log and drop such frames.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import cattrs
import msgpack
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ..errors import PeerProtocolError
from .messages import (
    TAGS,
    ErrorInfo,
    Limits,
    Message,
    ModelCard,
    OutputItem,
    Outputs,
    Pong,
    Submit,
    Usage,
    Welcome,
)

_CLASSES = {tag: cls for cls, tag in TAGS.items()}
_SUBMIT_TAG = TAGS[Submit]


def strict_collections(conv: cattrs.Converter) -> None:
    """Make ``conv`` structure lists only from arrays and dicts only from maps.

    cattrs' defaults iterate whatever they get, so a string would become a list of
    characters: for a wire format (or a JSON body) that is a type error, not a list.
    """
    from cattrs.cols import is_mapping, is_sequence, list_structure_factory

    def list_factory(type_: Any, converter: cattrs.Converter) -> Any:
        inner = list_structure_factory(type_, converter)

        def hook(value: Any, type_arg: Any) -> Any:
            if not isinstance(value, list):
                raise TypeError(f"expected an array, got {type(value).__name__}")
            return inner(value, type_arg)

        return hook

    def mapping_factory(type_: Any, converter: cattrs.Converter) -> Any:
        inner = converter.gen_structure_mapping(type_)

        def hook(value: Any, type_arg: Any) -> Any:
            if not isinstance(value, dict):
                raise TypeError(f"expected a map, got {type(value).__name__}")
            return inner(value, type_arg)

        return hook

    conv.register_structure_hook_factory(is_sequence, list_factory)
    conv.register_structure_hook_factory(is_mapping, mapping_factory)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=False)
    strict_collections(conv)
    # The per-token hot path: leave out empty optional fields of output items (nested
    # classes first, so the item's hook picks up theirs).
    for cls in (Usage, ErrorInfo, OutputItem):
        conv.register_unstructure_hook(
            cls, make_dict_unstructure_fn(cls, conv, _cattrs_omit_if_default=True)
        )
    # Fields added without a version bump are left out at their defaults: what a peer that
    # does not know them receives is byte for byte what it always did.
    conv.register_unstructure_hook(
        Pong, make_dict_unstructure_fn(Pong, conv, _cattrs_omit_if_default=True)
    )
    conv.register_unstructure_hook(
        Welcome,
        make_dict_unstructure_fn(Welcome, conv, draining=override(omit_if_default=True)),
    )

    # A submit's trace context is written only when there is one (the fields it had
    # before it are always written); its session key never (the frontend's routing hint).
    submit_fields = make_dict_unstructure_fn(Submit, conv, session_key=override(omit=True))

    def unstructure_submit(submit: Submit) -> dict[str, Any]:
        body = submit_fields(submit)
        if body["trace_context"] is None:
            del body["trace_context"]
        return body

    conv.register_unstructure_hook(Submit, unstructure_submit)

    # Strict scalars: a peer that sends a string where an int belongs is malformed, not
    # something to coerce silently.
    def _exact(kind: type) -> Any:
        def hook(value: Any, _: type) -> Any:
            if type(value) is kind or (kind is float and type(value) is int):
                return value
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")

        return hook

    for kind in (int, float, str, bool, bytes):
        conv.register_structure_hook(kind, _exact(kind))

    def _str_or_bytes(value: Any, _: Any) -> str | bytes | None:
        if value is None or isinstance(value, str | bytes):
            return value
        raise TypeError(f"expected str, bin or nil, got {type(value).__name__}")

    conv.register_structure_hook(str | bytes | None, _str_or_bytes)

    def _str_or_int(value: Any, _: Any) -> str | int | None:
        if value is None or type(value) is str or type(value) is int:
            return value
        raise TypeError(f"expected str, int or nil, got {type(value).__name__}")

    conv.register_structure_hook(str | int | None, _str_or_int)
    conv.register_structure_hook(Any, lambda value, _: value)

    # nil means "not given" for every field: an engine written in a language whose
    # encoder writes nil for empty maps and lists gets the field's default, not an error.
    for record in (Usage, ErrorInfo, ModelCard, Limits, OutputItem, *TAGS):
        # Submit.session_key is the frontend's routing hint, never read from the wire.
        omit: dict[str, Any] = {"session_key": override(omit=True)} if record is Submit else {}
        inner: Callable[[Any, Any], Any] = make_dict_structure_fn(record, conv, **omit)

        def hook(value: Any, type_: Any, inner: Any = inner) -> Any:
            if isinstance(value, dict) and None in value.values():
                value = {k: v for k, v in value.items() if v is not None}
            return inner(value, type_)

        conv.register_structure_hook(record, hook)
    return conv


converter = _make_converter()
_packer = msgpack.Packer(use_bin_type=True)
#: A frame larger than this is packed by a packer of its own: msgpack's keeps its buffer
#: at the largest size it ever grew to (twice a 16 MiB prompt: 32 MiB held for good).
PACKER_KEEP_BYTES = 1 << 20


def encode(message: Message) -> bytes:
    """Serialize one message into one frame."""
    if type(message) is Submit:
        # The per-request path. A submit's inputs and params are plain data (parsed JSON,
        # media as bytes), which the converter would copy unchanged: the same bytes.
        body = {
            "request_id": message.request_id,
            "model": message.model,
            "task": message.task,
            "inputs": message.inputs,
            "params": message.params,
        }
        if message.trace_context is not None:
            body["trace_context"] = message.trace_context
        return _pack([_SUBMIT_TAG, body])
    return _pack([TAGS[type(message)], converter.unstructure(message)])


def _pack(obj: Any) -> bytes:
    global _packer
    frame: bytes = _packer.pack(obj)
    if len(frame) > PACKER_KEEP_BYTES:
        _packer = msgpack.Packer(use_bin_type=True)  # the grown buffer goes with the old
    return frame


_PLAIN_ITEM_KEYS = frozenset(
    {
        "request_id",
        "seq",
        "modality",
        "data",
        "finish_reason",
        "mime_type",
        "usage",
        "queue_time",
        "stop_reason",
    }
)
_USAGE_KEYS = frozenset({"prompt_tokens", "completion_tokens"})
_TOKEN_KEYS = frozenset({"request_id", "seq", "data"})


def _fast_usage(raw: Any) -> Usage | Literal[False] | None:
    """An item's usage checked by hand: None (absent), a Usage, or False (not plain)."""
    if raw is None:
        return None
    if type(raw) is not dict or raw.keys() != _USAGE_KEYS:
        return False
    prompt = raw["prompt_tokens"]
    completion = raw["completion_tokens"]
    if type(prompt) is not int or type(completion) is not int:
        return False
    return Usage(prompt, completion)


def _fast_outputs(body: dict[str, object]) -> Outputs | None:
    """The per-token hot path: an outputs frame of plain items, checked by hand.

    Applies exactly the converter's rules (strict types, nil = absent, unknown keys
    ignored) to items whose only nested record is a plain usage (the last item of every
    request); returns None for anything else (an error item, unknown keys, a type
    mismatch), which then takes the converter's path and its detailed error messages.
    """
    raw = body.get("items")
    if type(raw) is not list or len(body) != 1:
        return None
    items: list[OutputItem] = []
    append = items.append
    for d in raw:
        if type(d) is not dict:
            return None
        keys = d.keys()
        if keys == _TOKEN_KEYS:
            # A plain token, most items of most frames: three lookups, three type checks.
            request_id = d["request_id"]
            seq = d["seq"]
            data = d["data"]
            if (
                type(request_id) is str
                and type(seq) is int
                and (type(data) is str or type(data) is bytes)
            ):
                append(OutputItem(request_id, seq, "text", data))
                continue
        if not keys <= _PLAIN_ITEM_KEYS:
            return None
        request_id = d.get("request_id")
        seq = d.get("seq")
        modality = d.get("modality")
        data = d.get("data")
        finish = d.get("finish_reason")
        mime = d.get("mime_type")
        usage = _fast_usage(d.get("usage"))
        queued = d.get("queue_time")
        stopped = d.get("stop_reason")
        if (
            usage is False
            or (stopped is not None and type(stopped) is not str and type(stopped) is not int)
            or (queued is not None and type(queued) is not float and type(queued) is not int)
            or type(request_id) is not str
            or type(seq) is not int
            or (modality is not None and type(modality) is not str)
            or (data is not None and type(data) is not str and type(data) is not bytes)
            or (finish is not None and type(finish) is not str)
            or (mime is not None and type(mime) is not str)
        ):
            return None
        item = OutputItem(request_id, seq, modality or "text", data, usage, finish, None, mime)
        if queued is not None:
            item.queue_time = queued
        if stopped is not None:
            item.stop_reason = stopped
        append(item)
    return Outputs(items)


def decode(frame: bytes) -> Message:
    """Parse one frame. Raises :class:`PeerProtocolError` for anything malformed."""
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise PeerProtocolError(f"not msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, list) or len(obj) != 2 or not isinstance(obj[0], str):
        raise PeerProtocolError("a frame must be a msgpack array [tag, body]")
    tag, body = obj
    cls = _CLASSES.get(tag)
    if cls is None:
        raise PeerProtocolError(f"unknown message tag {tag!r}")
    if not isinstance(body, dict):
        raise PeerProtocolError(f"body of {tag!r} must be a map")
    if cls is Outputs:
        fast = _fast_outputs(body)
        if fast is not None:
            return fast
    try:
        return converter.structure(body, cls)
    except Exception as exc:
        details = "; ".join(cattrs.transform_error(exc, path=tag))
        raise PeerProtocolError(f"malformed {tag!r}: {details}") from None

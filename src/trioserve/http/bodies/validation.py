"""Turning JSON bodies into typed requests, with errors that name the field.

cattrs does the structuring; the hooks here decide how forgiving a field is. Numbers and
booleans sent as strings (``"max_tokens": "16"``, ``"stream": "true"``) are accepted, as the
Python servers clients are used to accept them; anything that is not clearly a number or
a boolean is rejected. Errors come back as ``[{"loc": "$.messages[0].role", "msg": ...}]``,
at most :data:`MAX_ERRORS` of them (the rest counted in a last entry).

Integers are bounded to what the engine protocol carries and an engine holds: a signed
64-bit integer (msgpack has nothing past 64 bits, and a uint64 beyond int64 breaks any
engine that reads it as a length or a seed).
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs
import orjson

from ...protocol.codec import strict_collections
from ..errors import HTTPError

T = TypeVar("T")

#: The integers a request field may hold (int64).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: What an integer out of that range is told.
TOO_LARGE = "the engine protocol cannot carry integers beyond 64 bits (-2^63 to 2^63-1)"
#: Commas a JSON body may hold: a bound on the values it holds, checked with one C scan
#: before it is parsed. Parsing builds one Python object per value, on the event loop: a
#: 128 MiB body of ``{},{},…`` (44 million objects) took 3.7 s to parse and 0.9 s to free.
#: Legitimate bodies are long strings (prompts, base64), not millions of values; a comma
#: inside a string counts too, so the bound is set far above what a request's shape
#: allows (messages, parts: see openai_api), and above what prose holds in any context
#: window (a comma every 15 bytes or so: 4 MB of text). Measured in docs/security.md.
MAX_JSON_COMMAS = 2**18
#: Errors listed in a 422's ``details``: building and sending 300,000 of them took
#: seconds; past this many, one last entry counts the rest.
MAX_ERRORS = 20

TRUE = frozenset({"true", "t", "yes", "y", "on", "1"})
FALSE = frozenset({"false", "f", "no", "n", "off", "0"})


def _int(value: Any, _: type) -> int:
    number = _parse_int(value)
    if not INT_MIN <= number <= INT_MAX:
        raise ValueError(TOO_LARGE)
    return number


def _parse_int(value: Any) -> int:
    if type(value) is int:
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                pass
            else:
                if number.is_integer():
                    return int(number)
    raise ValueError(f"expected an integer, got {json.dumps(value)[:40]}")


def _float(value: Any, _: type) -> float:
    if type(value) in (int, float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {json.dumps(value)[:40]}") from None
    else:
        raise ValueError(f"expected a number, got {json.dumps(value)[:40]}")
    if not math.isfinite(number):
        raise ValueError("expected a finite number")
    return number


def parse_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in TRUE:
            return True
        if text in FALSE:
            return False
    raise ValueError(f"expected a boolean, got {json.dumps(value)[:40]}")


def _str(value: Any, _: type) -> str:
    if isinstance(value, str):
        return value
    raise ValueError(f"expected a string, got {type(value).__name__}")


def _any(value: Any, _: Any) -> Any:
    return value


@attrs.frozen
class Bounds:
    """The range a numeric field must be in, declared on the field (:func:`bounded`): the
    check below and the OpenAPI schema (``http/openapi/schemas.py``) both read it from there."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False

    def holds(self, value: float) -> bool:
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.exclusive_minimum else value < low):
            return False
        return high is None or value <= high

    def message(self) -> str:
        low, high = _number(self.minimum), _number(self.maximum)
        if self.minimum is not None and self.maximum is not None:
            if self.exclusive_minimum:
                return f"must be greater than {low} and at most {high}"
            return f"must be between {low} and {high}"
        if self.minimum is not None:
            return f"must be {'greater than' if self.exclusive_minimum else 'at least'} {low}"
        return f"must be at most {high}"


def _number(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def bounded(
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    exclusive_minimum: bool = False,
    **schema: Any,
) -> Any:
    """An optional numeric field (default None) that must lie in a range: checked by
    :func:`check_bounds`, and stated in the OpenAPI schema. ``schema``: more JSON Schema
    keywords for the documentation only (``description``, ...)."""
    return attrs.field(
        default=None,
        metadata={"bounds": Bounds(minimum, maximum, exclusive_minimum), "schema": schema},
    )


def documented(default: Any = None, **schema: Any) -> Any:
    """A field whose type says too little for the OpenAPI schema (``Any``: "a string or a
    list of strings"): the JSON Schema keywords that describe what the checks accept."""
    return attrs.field(default=default, metadata={"schema": schema})


_BOUNDED: dict[type, tuple[tuple[str, Bounds], ...]] = {}


def bounded_fields(cls: type) -> tuple[tuple[str, Bounds], ...]:
    """The fields of ``cls`` with :class:`Bounds`, in declaration order (cached)."""
    found = _BOUNDED.get(cls)
    if found is None:
        found = _BOUNDED[cls] = tuple(
            (a.name, a.metadata["bounds"]) for a in attrs.fields(cls) if "bounds" in a.metadata
        )
    return found


def check_bounds(req: Any, errors: list[dict[str, str]]) -> None:
    """Append an error for every bounded field of ``req`` out of its range. An integer
    past 64 bits says so (a body that skipped the converter can hold one)."""
    for name, bounds in bounded_fields(type(req)):
        value = getattr(req, name)
        if value is None:
            continue
        if type(value) is int and not INT_MIN <= value <= INT_MAX:
            errors.append({"loc": f"$.{name}", "msg": TOO_LARGE})
        elif not bounds.holds(value):
            errors.append({"loc": f"$.{name}", "msg": bounds.message()})


def make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    strict_collections(conv)
    conv.register_structure_hook(int, _int)
    conv.register_structure_hook(float, _float)
    conv.register_structure_hook(bool, lambda value, _: parse_bool(value))
    conv.register_structure_hook(str, _str)
    conv.register_structure_hook(Any, _any)

    def object_factory(cls: type, converter: cattrs.Converter) -> Any:
        from cattrs.gen import make_dict_structure_fn

        inner: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, converter)

        def hook(value: Any, type_: Any) -> Any:
            if not isinstance(value, dict):
                raise ValueError(f"expected an object, got {_json_type(value)}")
            return inner(value, type_)

        return hook

    conv.register_structure_hook_factory(attrs.has, object_factory)
    return conv


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else type(value).__name__


converter = make_converter()


def _format(exc: BaseException, _type: Any) -> str:
    if isinstance(exc, KeyError):
        return "field required"
    if isinstance(exc, ValueError | TypeError) and str(exc):
        return str(exc)
    return cattrs.v.format_exception(exc, _type)


def errors_of(exc: BaseException) -> list[dict[str, str]]:
    details = []
    for line in cattrs.transform_error(exc, path="$", format_exception=_format):
        msg, _, loc = line.rpartition(" @ ")
        details.append({"loc": loc, "msg": msg})
    return details


def invalid(details: list[dict[str, str]], more: int = 0) -> HTTPError:
    """The 422 for ``details`` (and ``more`` errors not listed), of which at most
    :data:`MAX_ERRORS` are listed."""
    more += max(len(details) - MAX_ERRORS, 0)
    if more:
        details = [
            *details[:MAX_ERRORS],
            {"loc": "$", "msg": f"{more} more error(s) not listed"},
        ]
    first = details[0]
    param = first["loc"].removeprefix("$.").removeprefix("$") or None
    return HTTPError(
        422,
        "; ".join(f"{d['loc']}: {d['msg']}" for d in details),
        "invalid_request",
        param=param,
        details=details,
    )


class Errors:
    """A 422's details as checks find them: the first :data:`MAX_ERRORS` are kept, the
    rest only counted, so a body with a million faults costs a counter, not a million
    error objects. ``add`` takes the location as a format string and its arguments, built
    only for what is kept."""

    __slots__ = ("details", "more")

    def __init__(self) -> None:
        self.details: list[dict[str, str]] = []
        self.more = 0

    def add(self, msg: str, loc: str, *args: object) -> None:
        if len(self.details) < MAX_ERRORS:
            self.details.append({"loc": loc % args if args else loc, "msg": msg})
        else:
            self.more += 1

    def extend(self, details: list[dict[str, str]]) -> None:
        for detail in details:
            self.add(detail["msg"], detail["loc"])

    def __bool__(self) -> bool:
        return bool(self.details)

    def error(self) -> HTTPError:
        return invalid(self.details, self.more)


def parse_json(body: bytes | str) -> Any:
    """A request body as JSON, strictly (RFC 8259: UTF-8, no NaN or Infinity); a 422
    naming the fault when it is not. orjson: a sixth of the json module's time, on
    every request's way to the engine."""
    commas = body.count(b",") if isinstance(body, bytes) else body.count(",")
    if commas > MAX_JSON_COMMAS:
        raise invalid(
            [{"loc": "$", "msg": f"the body holds more than {MAX_JSON_COMMAS} JSON values"}]
        )
    try:
        return orjson.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid([{"loc": "$", "msg": f"malformed JSON: {exc}"}]) from None


def structure(obj: Any, cls: type[T]) -> T:
    """Structure a decoded JSON object into ``cls`` or raise a 422 :class:`HTTPError`."""
    if not isinstance(obj, dict):
        raise invalid([{"loc": "$", "msg": "the body must be a JSON object"}])
    try:
        return converter.structure(obj, cls)
    except Exception as exc:
        errors = errors_of(exc)
        _clear_frames(exc)
        raise invalid(errors) from None


def _clear_frames(exc: BaseException) -> None:
    """Let go of what the frames of a validation failure hold. cattrs keeps each
    failure in a list of the frame that caught it, whose traceback holds that frame: a
    reference cycle, and the frames above it (the parse of the body) with it, so the
    body stayed until the garbage collector ran (with the server's gc tuning, long
    after: a 16 MiB body that failed validation held its 16 MiB, every time)."""
    pending = [exc]
    while pending:
        failure = pending.pop()
        traceback.clear_frames(failure.__traceback__)
        if isinstance(failure, BaseExceptionGroup):
            pending.extend(failure.exceptions)

"""Turning JSON bodies into typed requests, with errors that name the field.

cattrs does the structuring; the hooks here decide how forgiving a field is. Numbers and
booleans sent as strings (``"max_tokens": "16"``, ``"stream": "true"``) are accepted, as the
Python servers clients are used to accept them; anything that is not clearly a number or
a boolean is rejected. Errors come back as ``[{"loc": "$.messages[0].role", "msg": ...}]``.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

import attrs
import cattrs
import orjson

from ..protocol.codec import strict_collections
from .errors import HTTPError

T = TypeVar("T")

TRUE = frozenset({"true", "t", "yes", "y", "on", "1"})
FALSE = frozenset({"false", "f", "no", "n", "off", "0"})


def _int(value: Any, _: type) -> int:
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

        inner = make_dict_structure_fn(cls, converter)

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


def invalid(details: list[dict[str, str]]) -> HTTPError:
    first = details[0]
    param = first["loc"].removeprefix("$.").removeprefix("$") or None
    return HTTPError(
        422,
        "; ".join(f"{d['loc']}: {d['msg']}" for d in details),
        "invalid_request",
        param=param,
        details=details,
    )


def parse_json(body: bytes | str) -> Any:
    """A request body as JSON, strictly (RFC 8259: UTF-8, no NaN or Infinity); a 422
    naming the fault when it is not. orjson: a sixth of the json module's time, on
    every request's way to the engine."""
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
        raise invalid(errors_of(exc)) from None

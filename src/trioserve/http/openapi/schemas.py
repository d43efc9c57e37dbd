"""The JSON Schema of attrs request classes: the very classes cattrs validates requests
with, walked field by field (their types, which are required, the ranges
``validation.bounded`` declares, the schema ``validation.documented`` gives)."""

from __future__ import annotations

import types
import typing
from typing import Any

import attrs

from .content import INT64, ref


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str):
        out = {**schema, "type": [kind, "null"]}
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    if not schema:  # anything: null included
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


def type_schema(tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of a field type (an attrs class becomes a component)."""
    if tp is Any:
        return {}
    if tp is type(None):
        return {"type": "null"}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        present = [a for a in args if a is not type(None)]
        inner = (
            type_schema(present[0], components)
            if len(present) == 1
            else {"anyOf": [type_schema(a, components) for a in present]}
        )
        return _nullable(inner) if len(present) < len(args) else inner
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return dict(INT64)
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return {"type": "array", "items": type_schema(item, components)}
    if origin is dict or tp is dict:
        return {"type": "object"}
    if attrs.has(tp):
        name = tp.__name__
        if name not in components:
            components[name] = {}  # (a class that refers to itself)
            components[name] = class_schema(tp, components)
        return ref(name)
    raise TypeError(f"no JSON Schema for {tp!r}")


def class_schema(cls: type, components: dict[str, Any]) -> dict[str, Any]:
    """The object schema of an attrs request class: a property per field, the fields
    without a default required; other properties are allowed (a route passes the fields
    it does not know to the engine)."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        properties[field.name] = field_schema(field, hints[field.name], components)
        if field.default is attrs.NOTHING:
            required.append(field.name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def field_schema(field: Any, tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    declared = field.metadata.get("schema") or {}
    bounds = field.metadata.get("bounds")
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else ()
    optional = type(None) in args or field.default is None
    base = [a for a in args if a is not type(None)] if args else [tp]
    if "anyOf" in declared:
        # The declared alternatives replace what the type says (``Any``).
        alternatives = declared["anyOf"]
        if optional and {"type": "null"} not in alternatives:
            alternatives = [*alternatives, {"type": "null"}]
        return {**declared, "anyOf": alternatives}
    schema = type_schema(base[0] if len(base) == 1 else tp, components)
    if "$ref" in schema and declared:
        schema = {"allOf": [schema]}
    schema.update(declared)
    if bounds is not None:
        if bounds.minimum is not None:
            key = "exclusiveMinimum" if bounds.exclusive_minimum else "minimum"
            schema.pop("minimum", None)
            schema[key] = bounds.minimum
        if bounds.maximum is not None:
            schema["maximum"] = bounds.maximum
    return _nullable(schema) if optional and schema else schema

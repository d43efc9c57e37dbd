"""Structured outputs for the engine: vLLM's ``StructuredOutputsParams`` from a request's
``structured_outputs`` and ``response_format``, checked as vLLM checks them, with the
backend its input processor picks (``SamplingParams._validate_structured_outputs``).

With ``--structured-outputs-config.backend auto`` (vLLM's default) vLLM takes xgrammar
when xgrammar accepts the constraint, else guidance (or outlines, for a JSON schema with
``patternProperties``); a constraint the chosen backend refuses is a 400 before the engine
sees it. The choice needs the two libraries, ``xgrammar`` and ``llguidance``, which vLLM
installs: where they are missing (a frontend outside vLLM's environment), xgrammar is
taken unchecked, and a constraint it refuses ends with the engine's error output (a 500),
never a wedged engine.
"""

from __future__ import annotations

import importlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..errors import TextInputError

#: vLLM's bounds (``MAX_STRUCTURED_OUTPUT_JSON_NESTING``, ``STRUCTURAL_TAG_WRAPPER_NESTING``,
#: ``VLLM_REGEX_COMPILATION_TIMEOUT_S``).
MAX_JSON_NESTING = 64
TAG_NESTING = 16
REGEX_TIMEOUT = 5.0
#: String formats xgrammar's JSON schema converter knows (vLLM's
#: ``STRING_SUPPORTED_FORMATS``).
XGRAMMAR_FORMATS = frozenset(
    {
        "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname",
        "uuid", "uri", "uri-reference", "uri-template", "json-pointer",
        "relative-json-pointer",
    }
)  # fmt: skip


def _fail(message: str, param: str | None = "structured_outputs") -> TextInputError:
    return TextInputError(message, param=param)


class _Refused(Exception):
    """A backend refused the constraint (vLLM's ``VLLMValidationError`` there)."""


#: The constraint fields of vLLM's ``StructuredOutputsParams``.
_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")


def structured_outputs(params: dict[str, Any], backend: str) -> dict[str, Any] | None:
    """The ``structured_outputs`` value for the engine, from ``structured_outputs`` and
    ``response_format`` (vLLM's ``structured_outputs_from_response_format``), with its
    ``_backend`` set as vLLM's processor sets it (:func:`choose_backend`; ``backend``:
    ``--structured-outputs-config.backend``)."""
    given = params.get("structured_outputs")
    response_format = params.get("response_format")
    if given is not None and not isinstance(given, dict):
        raise _fail("structured_outputs must be an object", "structured_outputs")
    so: dict[str, Any] = {}
    if given:
        unknown = set(given) - set(_CONSTRAINTS) - set(_OPTIONS)
        if unknown:
            raise _fail(
                f"unknown structured_outputs fields: {sorted(unknown)}", "structured_outputs"
            )
        so.update(given)
    if response_format is not None:
        if not isinstance(response_format, dict) or not isinstance(
            response_format.get("type"), str
        ):
            raise _fail("response_format must be an object with a 'type'", "response_format")
        kind = response_format["type"]
        if kind == "json_object":
            so["json_object"] = True
        elif kind == "json_schema":
            schema = response_format.get("json_schema")
            if not isinstance(schema, dict):
                raise _fail(
                    "When response_format type is 'json_schema', the 'json_schema' field "
                    "must be provided.",
                    "response_format",
                )
            so["json"] = schema.get("schema", schema.get("json_schema"))
        elif kind in ("structural_tag",):
            so["structural_tag"] = json.dumps(response_format)
        elif kind != "text":
            raise _fail(f"unsupported response_format type {kind!r}", "response_format")
    if not so:
        return None
    count = sum(so.get(k) is not None for k in _CONSTRAINTS)
    if count > 1:
        raise _fail(
            "You can only use one kind of structured outputs constraint but multiple are "
            f"specified: {so}",
            "structured_outputs",
        )
    if count < 1:
        raise _fail(
            f"You must use one kind of structured outputs constraint but none are specified: {so}",
            "structured_outputs",
        )
    choice, grammar, schema = so.get("choice"), so.get("grammar"), so.get("json")
    if choice is not None and (
        not isinstance(choice, list) or not all(isinstance(c, str) for c in choice)
    ):
        raise _fail("structured_outputs.choice must be a list of strings", "structured_outputs")
    if choice == []:
        raise _fail(f"Choice '{choice}' cannot be an empty list", "structured_outputs")
    for name in ("regex", "grammar", "structural_tag", "whitespace_pattern"):
        if so.get(name) is not None and not isinstance(so[name], str):
            raise _fail(f"structured_outputs.{name} must be a string", "structured_outputs")
    if isinstance(grammar, str) and not grammar.strip():
        raise _fail("structured_outputs.grammar cannot be an empty string", "structured_outputs")
    if schema is not None and not isinstance(schema, (str, dict)):
        raise _fail("structured_outputs.json must be a schema", "structured_outputs")
    if isinstance(schema, str) and not schema.strip():
        raise _fail("structured_outputs.json cannot be an empty string", "structured_outputs")
    if so.get("json_object") is False:
        raise _fail(
            "structured_outputs.json_object must be True if set; omit structured_outputs to "
            "disable structured outputs",
            "structured_outputs",
        )
    if so.get("regex") and "\x00" in so["regex"]:
        raise _fail(
            "structured_outputs.regex must not contain a NUL character ('\\x00')",
            "structured_outputs",
        )
    tag = so.get("structural_tag")
    if isinstance(tag, str) and not tag.strip():
        raise _fail(
            "structured_outputs.structural_tag cannot be an empty string", "structured_outputs"
        )
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except ValueError:
            raise _fail("Invalid JSON grammar specification.", "structured_outputs") from None
    for spec, limit in ((schema, MAX_JSON_NESTING), (tag, MAX_JSON_NESTING + TAG_NESTING)):
        if spec and _exceeds_nesting(spec, limit):
            raise _fail(
                "The JSON schema is nested too deeply: objects and arrays may nest at most "
                f"{MAX_JSON_NESTING} levels",
                "structured_outputs",
            )
    out = {k: so.get(k) for k in _CONSTRAINTS}
    out.update(
        disable_any_whitespace=bool(so.get("disable_any_whitespace", False)),
        disable_additional_properties=bool(so.get("disable_additional_properties", False)),
        whitespace_pattern=so.get("whitespace_pattern"),
    )
    choose_backend(out, backend)
    return out


def choice_as_grammar(choice: list[str]) -> str:
    """vLLM's ``choice_as_grammar``: the choices as an EBNF alternation."""
    escapes = {"\\": r"\\", '"': r"\"", "\n": r"\n", "\r": r"\r", "\t": r"\t"}

    def escape(ch: str) -> str:
        if ch in escapes:
            return escapes[ch]
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            return f"\\u{ord(ch):04x}"
        return ch

    return "root ::= " + " | ".join('"' + "".join(map(escape, c)) + '"' for c in choice)


def sanitized(message: str) -> str:
    """A library's message as vLLM's server answers it (``sanitize_message``): no memory
    addresses, traceback lines or file paths, no surrounding whitespace."""
    message = re.sub(r" at 0x[0-9a-fA-F]+>", ">", message)
    message = re.sub(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?', "", message)
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>", message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    return message.strip()


def _library(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def choose_backend(so: dict[str, Any], backend: str) -> None:
    """Set ``so``'s ``_backend`` (and ``_backend_was_auto``) as vLLM's input processor
    does for the server's ``backend``, after the backend's own checks (400 for what it
    refuses). xgrammar's check turns a ``choice`` into its grammar, as vLLM's does."""
    xgrammar, llguidance = _library("xgrammar"), _library("llguidance")
    try:
        if backend.startswith("xgrammar"):
            _check_xgrammar(so, xgrammar)
        elif backend.startswith("guidance"):
            if llguidance is not None:
                _check_guidance(so, llguidance)
        elif backend == "auto":
            so["_backend_was_auto"] = True
            try:
                _check_xgrammar(so, xgrammar)
                backend = "xgrammar"
            except _Refused:
                schema = so["json"]
                if isinstance(schema, str):
                    schema = json.loads(schema)
                if schema and _has_guidance_unsupported_features(schema):
                    backend = "outlines"  # (checked by the engine)
                else:
                    if llguidance is not None:
                        _check_guidance(so, llguidance)
                    backend = "guidance"
    except _Refused as refused:
        raise _fail(sanitized(str(refused))) from None
    so["_backend"] = backend
    so.setdefault("_backend_was_auto", False)


def _check_xgrammar(so: dict[str, Any], xgr: Any) -> None:
    """vLLM's ``validate_xgrammar_grammar`` (without xgrammar: the choice's grammar only)."""
    if so["choice"]:
        grammar = choice_as_grammar(so["choice"])
        if xgr is not None:
            _attempt(
                lambda: xgr.Grammar.from_ebnf(grammar),
                "Failed to transform choices into a grammar: {}",
            )
        so["choice"], so["grammar"] = None, grammar
        return
    if xgr is None:
        return
    if so["regex"]:
        _attempt(
            lambda: _with_timeout(xgr.Grammar.from_regex, so["regex"]),
            "Failed to transform regex into a grammar: {}",
        )
    if so["json"]:
        schema = so["json"]
        if isinstance(schema, str):
            schema = json.loads(schema)
        if _has_xgrammar_unsupported_features(schema):
            raise _Refused("The provided JSON schema contains features not supported by xgrammar.")
        _attempt(
            lambda: xgr.Grammar.from_json_schema(schema),
            "Failed to transform json schema into a grammar: {}",
        )
        return
    if so["grammar"]:
        grammar = so["grammar"]
        parse = xgr.Grammar.from_lark if _likely_lark(grammar) else xgr.Grammar.from_ebnf
        _attempt(lambda: parse(grammar), "Invalid grammar specification.")
        return
    if so["structural_tag"]:
        _attempt(
            lambda: _xgrammar_tag(xgr, so["structural_tag"]),
            "Invalid structural tag specification.",
        )


def _xgrammar_tag(xgr: Any, spec: str) -> Any:
    tag = json.loads(spec)
    if "structures" in tag:
        items = [
            xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
            for s in tag["structures"]
        ]
        return xgr.Grammar.from_structural_tag(items, tag["triggers"])
    return xgr.Grammar.from_structural_tag(spec)


def _attempt(build: Any, message: str) -> None:
    try:
        build()
    except _Refused:
        raise
    except Exception as error:  # the library's own, whatever its class
        raise _Refused(message.format(error)) from None


def _with_timeout(build: Any, pattern: str) -> Any:
    """vLLM's ``compile_regex_with_timeout``: a regex whose automaton explodes is refused
    after :data:`REGEX_TIMEOUT` seconds (its thread is left to finish alone)."""
    executor = ThreadPoolExecutor(max_workers=1)
    future = executor.submit(build, pattern)
    try:
        return future.result(timeout=REGEX_TIMEOUT)
    except FutureTimeout:
        raise _Refused(
            f"Regex compilation timed out after {REGEX_TIMEOUT:g}s. The pattern may be too "
            "complex or contain constructs that cause exponential state-space growth."
        ) from None
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def _check_guidance(so: dict[str, Any], llg: Any) -> None:
    """vLLM's ``validate_guidance_grammar`` (``serialize_guidance_grammar``, then
    llguidance's check, without a tokenizer as vLLM's for HF tokenizers)."""
    flexible = {"whitespace_flexible": True}
    try:
        if so["json"] is not None:
            schema = so["json"] if isinstance(so["json"], str) else json.dumps(so["json"])
            grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=flexible)
        elif so["json_object"]:
            grammar = llg.LLMatcher.grammar_from_json_schema(
                '{"type": "object"}', defaults=flexible
            )
        elif so["regex"] is not None:
            grammar = llg.grammar_from("regex", so["regex"])
        elif so["choice"] is not None:
            grammar = llg.grammar_from("choice", json.dumps(so["choice"]))
        elif so["grammar"] is not None:
            grammar = llg.grammar_from("grammar", so["grammar"])
        else:
            grammar = _guidance_tag(llg, so["structural_tag"])
    except (ValueError, KeyError, TypeError) as error:
        raise _Refused(f"Invalid grammar specification: {error}") from None
    refusal = llg.LLMatcher.validate_grammar(grammar, None)
    if refusal:
        raise _Refused(f"Grammar error: {refusal}")


def _guidance_tag(llg: Any, spec: str) -> Any:
    tag = json.loads(spec)
    triggers = tag["triggers"]
    tags = []
    for s in tag["structures"]:
        trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
        if trigger is None:
            raise _Refused(f"Trigger {s['begin']} not found in triggers {triggers}")
        schema = llg.LLMatcher.grammar_from_json_schema(
            s["schema"], defaults={"whitespace_flexible": True}
        )
        tags.append(llg.StructTag(trigger=trigger, begin=s["begin"], grammar=schema, end=s["end"]))
    if not tags:
        raise _Refused("No structural tags found in the grammar spec.")
    return llg.StructTag.to_grammar(tags)


def _likely_lark(grammar: str) -> bool:
    """vLLM's ``grammar_is_likely_lark``: no line defines a rule with ``::=``."""
    for line in grammar.split("\n"):
        line = re.sub(r"(#|//).*$", "", line).strip()
        if "::=" in line:
            return False
    return True


def _exceeds_nesting(spec: str | dict[str, Any], limit: int) -> bool:
    """vLLM's ``_exceeds_json_nesting``: objects and arrays nested deeper than ``limit``."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except RecursionError:
            return True
        except ValueError:
            return False
    level: list[Any] = [spec]
    for _ in range(limit):
        level = [
            child
            for node in level
            if isinstance(node, (dict, list))
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
        if not level:
            return False
    return True


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return set()


def _pattern_and_length(schema: dict[str, Any]) -> bool:
    return ("pattern" in schema or "format" in schema) and (
        "minLength" in schema or "maxLength" in schema
    )


def _unsupported_by_xgrammar(obj: dict[str, Any]) -> bool:
    """One schema object's features xgrammar does not implement (vLLM's
    ``has_xgrammar_unsupported_json_features``, one level)."""
    types = _types(obj)
    if types & {"integer", "number"} and "multipleOf" in obj:
        return True
    if "array" in types and any(
        k in obj for k in ("uniqueItems", "contains", "minContains", "maxContains")
    ):
        return True
    if "string" in types and "format" in obj and obj["format"] not in XGRAMMAR_FORMATS:
        return True
    if "string" in types and _pattern_and_length(obj):
        return True
    if "object" in types and "propertyNames" in obj:
        names = obj.get("propertyNames")
        if isinstance(names, dict) and _pattern_and_length(names):
            return True
        if "patternProperties" in obj or "properties" in obj:
            return True
        if obj.get("unevaluatedProperties", True) is not True:
            return True
    patterns = obj.get("patternProperties")
    if (
        "object" in types
        and isinstance(patterns, dict)
        and ("properties" in obj or len(patterns) > 1)
    ):
        return True
    all_of = obj.get("allOf")
    return isinstance(all_of, list) and len(all_of) >= 2


def _any_object(schema: Any, test: Any) -> bool:
    """Whether ``test`` holds for ``schema`` or any object nested in it."""
    if not isinstance(schema, dict):
        return False
    if test(schema):
        return True
    for value in schema.values():
        children = value if isinstance(value, list) else [value]
        if any(isinstance(c, dict) and _any_object(c, test) for c in children):
            return True
    return False


def _has_xgrammar_unsupported_features(schema: Any) -> bool:
    return _any_object(schema, _unsupported_by_xgrammar)


def _has_guidance_unsupported_features(schema: Any) -> bool:
    return _any_object(schema, lambda obj: "patternProperties" in obj)

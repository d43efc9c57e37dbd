"""Structured outputs' backend, chosen as vLLM's input processor chooses it: xgrammar when
it accepts the constraint, else guidance, or outlines for a schema guidance cannot take; a
constraint the chosen backend refuses is a 400. The libraries are faked here (vLLM's
environment has the real ones: tests/vllm/test_direct_vllm.py compares with vllm serve)."""

from __future__ import annotations

from typing import Any

import pytest

from trioserve.errors import TextInputError
from trioserve.text import structured
from trioserve.text.structured import structured_outputs


class FakeGrammar:
    """xgrammar's ``Grammar`` builders: each refuses what ``refused`` names."""

    refused: set[str] = set()

    @classmethod
    def _build(cls, kind: str, spec: Any) -> str:
        if kind in cls.refused:
            raise RuntimeError(f"xgrammar refuses this {kind}")
        return f"{kind}:{spec}"

    @classmethod
    def from_regex(cls, spec: str) -> str:
        return cls._build("regex", spec)

    @classmethod
    def from_ebnf(cls, spec: str) -> str:
        return cls._build("ebnf", spec)

    @classmethod
    def from_lark(cls, spec: str) -> str:
        return cls._build("lark", spec)

    @classmethod
    def from_json_schema(cls, spec: Any) -> str:
        return cls._build("json", spec)


class FakeXgrammar:
    Grammar = FakeGrammar


class FakeMatcher:
    refusal: str = ""

    @staticmethod
    def grammar_from_json_schema(schema: str, defaults: Any = None) -> str:
        return f"json:{schema}"

    @classmethod
    def validate_grammar(cls, grammar: str, tokenizer: Any) -> str:
        return cls.refusal


class FakeGuidance:
    LLMatcher = FakeMatcher

    @staticmethod
    def grammar_from(kind: str, spec: str) -> str:
        return f"{kind}:{spec}"


@pytest.fixture
def libraries(monkeypatch: pytest.MonkeyPatch):
    FakeGrammar.refused = set()
    FakeMatcher.refusal = ""
    fakes = {"xgrammar": FakeXgrammar, "llguidance": FakeGuidance}
    monkeypatch.setattr(structured, "_library", fakes.get)
    return fakes


def schema_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}


def test_auto_takes_xgrammar_when_it_accepts_and_a_choice_becomes_its_grammar(libraries):
    so = structured_outputs({"structured_outputs": {"choice": ["yes", "no"]}}, "auto")
    assert so is not None
    assert (so["_backend"], so["_backend_was_auto"]) == ("xgrammar", True)
    assert so["choice"] is None and so["grammar"] == 'root ::= "yes" | "no"'


def test_auto_falls_back_to_guidance_when_xgrammar_refuses(libraries):
    FakeGrammar.refused = {"regex"}
    so = structured_outputs({"structured_outputs": {"regex": "a+"}}, "auto")
    assert so is not None and (so["_backend"], so["_backend_was_auto"]) == ("guidance", True)


def test_a_schema_feature_xgrammar_lacks_goes_to_guidance_and_its_refusal_is_a_400(libraries):
    unique = schema_body({"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    so = structured_outputs(unique, "auto")
    assert so is not None and so["_backend"] == "guidance"
    FakeMatcher.refusal = 'Unimplemented keys: ["uniqueItems"]'
    with pytest.raises(TextInputError) as refused:
        structured_outputs(unique, "auto")
    assert refused.value.message == 'Grammar error: Unimplemented keys: ["uniqueItems"]'
    assert refused.value.param == "structured_outputs"


def test_a_schema_guidance_cannot_take_goes_to_outlines(libraries):
    body = schema_body({"type": "object", "patternProperties": {"^a": {}}, "properties": {}})
    so = structured_outputs(body, "auto")
    assert so is not None and so["_backend"] == "outlines"


def test_a_named_backend_has_no_fallback(libraries):
    FakeGrammar.refused = {"ebnf"}
    with pytest.raises(TextInputError) as refused:
        structured_outputs({"structured_outputs": {"grammar": "root ::= x"}}, "xgrammar")
    assert refused.value.message == "Invalid grammar specification."
    so = structured_outputs({"structured_outputs": {"grammar": "start: x"}}, "guidance")
    assert so is not None and (so["_backend"], so["_backend_was_auto"]) == ("guidance", False)


def test_a_lark_grammar_is_parsed_as_lark():
    assert structured._likely_lark("start: 'a' // comment")
    assert not structured._likely_lark("root ::= 'a'")


def test_a_schema_nested_too_deeply_is_a_400_before_any_backend(libraries):
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(70):
        schema = {"type": "array", "items": schema}
    with pytest.raises(TextInputError) as refused:
        structured_outputs(schema_body(schema), "auto")
    assert "nested too deeply" in refused.value.message


def test_without_the_libraries_xgrammar_is_taken_unchecked(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(structured, "_library", lambda name: None)
    so = structured_outputs({"structured_outputs": {"regex": "[a-z"}}, "auto")
    assert so is not None and so["_backend"] == "xgrammar"
    so = structured_outputs({"structured_outputs": {"choice": ["a"]}}, "auto")
    assert so is not None and so["grammar"] == 'root ::= "a"'

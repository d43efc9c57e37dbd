"""The constraint trioserve hands the engine for a request with tools is vLLM 0.32's own:
the same structural tag (byte for byte) or JSON schema, for every tool-call format, for
``required``, a named function, and ``auto`` (constrained only with a strict tool or
``parallel_tool_calls: false``), at each ``--tool-strict-level``, as vLLM's serving layer
adjusts the same request (``constraint_reference.py``, run by the vLLM interpreter; no
engine). What the model can write under a forced call is what it could write under
``vllm serve``."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.vllm_session import HOW_TO_RUN, vllm_env, vllm_python
from trioserve.http.bodies.agents import tool_constraint

REFERENCE = Path(__file__).with_name("constraint_reference.py")


def tool(name: str, strict: bool | None = None, parameters: Any = None) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": name,
        "description": f"the {name} tool",
        "parameters": parameters
        or {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    }
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


TOOLS = [tool("get_weather"), tool("get_time", parameters={"type": "object", "properties": {}})]
STRICT = [tool("get_weather", strict=True), tool("get_time", strict=False)]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
FORMATS = ["hermes", "qwen3_json", "llama3_json", "llama4_json", "qwen3_coder", "qwen3_xml"]
FORMATS += ["mistral"]

WEATHER_SCHEMA = {"type": "object", "properties": {"sky": {"type": "string"}}}
#: The request's own constraints: a response format, or structured outputs (``so``).
OWN = [
    {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA}},
    {"type": "structural_tag", "format": {"type": "const_string", "value": "sunny"}},
    {"so": {"regex": "(sunny|rainy)"}},
    {"so": {"choice": ["sunny", "rainy"]}},
    {"so": {"grammar": 'root ::= "sunny" | "rainy"'}},
    {"so": {"json": json.dumps(WEATHER_SCHEMA)}},
]

#: (tools, tool_choice, parallel_tool_calls, response_format) of each case: with a
#: constraint of the request's own, ``auto`` and a strict tool are the calls or it.
REQUESTS = [
    (TOOLS, "required", None, None),
    (TOOLS, NAMED, None, None),
    (TOOLS, "required", False, None),
    (TOOLS, NAMED, False, None),
    (STRICT, "required", None, None),
    (STRICT, NAMED, None, None),
    (TOOLS, "auto", None, None),
    (STRICT, "auto", None, None),
    (TOOLS, "auto", False, None),
    (TOOLS, "required", None, {"type": "json_object"}),
    (TOOLS, "auto", None, {"type": "json_object"}),
    *((STRICT, "auto", None, own) for own in OWN),
    (STRICT, "auto", False, {"type": "json_object"}),
    (TOOLS, "auto", False, {"type": "json_object"}),
    (STRICT, "required", None, {"so": {"regex": "(sunny|rainy)"}}),
]
#: ``--tool-strict-level`` above "auto": every request with tools has its call envelope
#: constrained ("function"), and every tool's arguments too ("parameter").
LEVELED = [
    (TOOLS, "auto", None, None),
    (TOOLS, "required", None, None),
    (STRICT, "auto", None, None),
    (TOOLS, "auto", None, {"type": "json_object"}),
    (TOOLS, "auto", False, None),
]
CASES = [(name, *request, "auto") for name in FORMATS for request in REQUESTS]
CASES += [
    (name, *request, level)
    for level in ("function", "parameter")
    for name in FORMATS
    for request in LEVELED
]


@pytest.fixture(scope="module")
def vllm_constraints() -> list[Any]:
    python = vllm_python()
    if python is None:
        pytest.skip(HOW_TO_RUN)
    cases = [
        {
            "tool_parser": name,
            "tools": tools,
            "tool_choice": choice,
            "parallel_tool_calls": parallel,
            "response_format": response_format,
            "tool_strict_level": level,
        }
        for name, tools, choice, parallel, response_format, level in CASES
    ]
    result = subprocess.run(
        [python, str(REFERENCE)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=vllm_env(),
        timeout=600,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.mark.parametrize(("index", "case"), list(enumerate(CASES)), ids=repr)
def test_the_engine_is_constrained_as_vllm_serve_constrains_it(vllm_constraints, index, case):
    name, tools, choice, parallel, response_format, level = case
    params: dict[str, Any] = {}
    if response_format is not None and "so" in response_format:
        params["structured_outputs"] = response_format["so"]
    elif response_format is not None:
        params["response_format"] = response_format
    ours = tool_constraint(name, copy.deepcopy(tools), choice, parallel, params, level)
    theirs = vllm_constraints[index]
    if name == "mistral" or "json" in (theirs or {}):
        assert ours == theirs
        return
    assert ours == theirs  # the structural tag's JSON, byte for byte

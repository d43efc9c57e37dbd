"""What vLLM's own server constrains a request with tools to: run by the vLLM interpreter
(tests/vllm/test_tool_constraints.py), it reads cases as JSON on stdin (a tool-call parser
and a chat request's tool fields), lets the parser vLLM's serving layer builds for the
request adjust it (``Parser.adjust_request``: the structural tag, or the JSON schema, a
forced call is held to), and writes the request's structured outputs as JSON on stdout.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from parser_reference import parser_class, tokenizer


def constraint(case: dict[str, Any], tok: Any) -> dict[str, Any] | None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for key in ("tools", "tool_choice", "parallel_tool_calls", "response_format"):
        if case.get(key) is not None:
            body[key] = case[key]
    if "so" in (case.get("response_format") or {}):  # structured outputs, not a format
        body["structured_outputs"] = body.pop("response_format")["so"]
    request = ChatCompletionRequest.model_validate(body)
    own = request.structured_outputs
    request = parser_class(case)(tok, request.tools).adjust_request(request)
    so = request.structured_outputs
    if so is None or so is own:  # none, or the request's own kept alone
        return None
    out = {k: getattr(so, k) for k in ("json", "structural_tag") if getattr(so, k) is not None}
    return out or {"other": repr(so)}


def main() -> None:
    logging.disable(logging.CRITICAL)
    tok = tokenizer()
    results = []
    for case in json.load(sys.stdin):
        try:
            results.append(constraint(case, tok))
        except Exception as exc:  # what vLLM does with it is the result too
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

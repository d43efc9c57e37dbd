"""vLLM's own parsers on given model outputs: run by the vLLM interpreter (tests/vllm/
test_parser_parity.py), it reads cases as JSON on stdin and writes what vLLM's serving
layer makes of each, whole (``Parser.parse``, as a JSON answer) and streamed one token at a
time (``Parser.parse_delta``, as SSE), as JSON on stdout.

The tokenizer is built here (byte-level BPE, the markers as added tokens, as a real
model's vocabulary has them), so no model is needed.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

MARKERS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[THINK]",
    "[/THINK]",
    "<|im_start|>",
    "<|im_end|>",
]


def tokenizer() -> Any:
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = tokenizers.Tokenizer(models.BPE(unk_token=None))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    raw.train_from_iterator(
        ['{"name": "get_weather", "arguments": {"city": "Paris"}}', "The answer is 4."],
        trainer=trainer,
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>")
    fast.add_special_tokens({"additional_special_tokens": MARKERS})
    return fast


def request(case: dict[str, Any]) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for key in ("tools", "tool_choice", "chat_template_kwargs", "parallel_tool_calls"):
        if case.get(key) is not None:
            body[key] = case[key]
    return ChatCompletionRequest.model_validate(body)


def parser_class(case: dict[str, Any]) -> Any:
    from vllm.parser.parser_manager import ParserManager

    return ParserManager.get_parser(
        tool_parser_name=case.get("tool_parser"),
        reasoning_parser_name=case.get("reasoning_parser"),
        enable_auto_tools=case.get("tool_parser") is not None,
        tool_strict_level=case.get("tool_strict_level", "auto"),
    )


def whole(case: dict[str, Any], tok: Any) -> dict[str, Any]:
    req = request(case)
    parser = parser_class(case)(
        tok, req.tools, chat_template_kwargs=case.get("chat_template_kwargs")
    )
    ids = tok.encode(case["text"], add_special_tokens=False)
    reasoning, content, calls = parser.parse(
        case["text"],
        req,
        enable_auto_tools=case.get("tool_parser") is not None,
        model_output_token_ids=ids,
    )
    return {
        "reasoning": reasoning,
        "content": content,
        "calls": [{"name": c.name, "arguments": c.arguments} for c in calls or []],
    }


def streamed(case: dict[str, Any], tok: Any) -> dict[str, Any]:
    req = request(case)
    parser = parser_class(case)(
        tok, req.tools, chat_template_kwargs=case.get("chat_template_kwargs")
    )
    ids = tok.encode(case["text"], add_special_tokens=False)
    out: dict[str, Any] = {"reasoning": "", "content": "", "calls": []}
    previous = ""
    pending: list[int] = []
    for i in range(len(ids)):
        pending.append(ids[i])
        text = tok.decode(ids[: i + 1])
        last = i == len(ids) - 1
        if text.endswith("\ufffd") and not last:
            continue  # a character split across tokens: vLLM's detokenizer waits for it
        delta, previous = text[len(previous) :], text
        message = parser.parse_delta(delta, pending, req, prompt_token_ids=[], finished=last)
        pending = []
        if message is None:
            continue
        out["reasoning"] += message.reasoning or ""
        out["content"] += message.content or ""
        for call in message.tool_calls or []:
            while len(out["calls"]) <= call.index:
                out["calls"].append({"name": None, "arguments": ""})
            entry = out["calls"][call.index]
            if call.function and call.function.name:
                entry["name"] = call.function.name
            if call.function and call.function.arguments:
                entry["arguments"] += call.function.arguments
    return out


def main() -> None:
    logging.disable(logging.CRITICAL)
    tok = tokenizer()
    results = []
    for case in json.load(sys.stdin):
        result: dict[str, Any] = {}
        for name, run in (("whole", whole), ("streamed", streamed)):
            try:
                result[name] = run(case, tok)
            except Exception as exc:  # what vLLM does with it is the result too
                result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results.append(result)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

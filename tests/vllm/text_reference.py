"""vLLM's own text pipeline on the cases of tests/vllm/test_text_parity.py: run under the
vLLM interpreter (``python text_reference.py CASES.json OUT.json``; the cases name their
model directories), it answers
each case with what vLLM 0.32's code does (rendering, tokenizing, detokenizing with stop
strings, sampling-parameter lowering and validation, logprob token strings), for the test to
compare with trioserve's text layer. No engine: only vLLM's frontend-side functions."""

from __future__ import annotations

import copy
import json
import sys
import time
from typing import Any


def main(cases_path: str, out_path: str) -> None:
    with open(cases_path) as f:
        cases = json.load(f)
    answers = {name: answer(model) for name, model in cases.items()}
    with open(out_path, "w") as f:
        json.dump(answers, f)


def answer(cases: dict[str, Any]) -> dict[str, Any]:
    from vllm.config import ModelConfig
    from vllm.config.structured_outputs import StructuredOutputsConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import (
        resolve_chat_template_content_format,
        safe_apply_chat_template,
    )
    from vllm.sampling_params import SamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer
    from vllm.v1.engine.logprobs import LogprobsProcessor

    model_dir = cases["dir"]
    tok = get_tokenizer(model_dir)
    mc = ModelConfig(model=model_dir, tokenizer=model_dir, max_model_len=cases["max_model_len"])
    defaults = mc.get_diff_sampling_param()
    generation = mc.try_get_generation_config()
    out: dict[str, Any] = {}

    def error(exc: BaseException) -> dict[str, Any]:
        return {"error": str(exc), "param": getattr(exc, "parameter", None)}

    renders = []
    for case in cases["render"]:
        try:
            fmt = resolve_chat_template_content_format(
                None, case.get("tools"), "auto", tok, model_config=mc
            )
            request = ChatCompletionRequest(
                model="m", messages=case["messages"], tools=case.get("tools"), **case["options"]
            )
            # (parse_chat_messages turns tool call arguments into objects in place)
            messages = copy.deepcopy(case["messages"])
            conversation, _, _ = parse_chat_messages(messages, mc, fmt)
            kwargs = request.build_chat_params(None, "auto").get_apply_chat_template_kwargs()
            kwargs.pop("chat_template", None)
            kwargs.pop("return_dict", None)
            tools = None if request.tools is None else [t.model_dump() for t in request.tools]
            text = safe_apply_chat_template(
                mc, tok, conversation, tools=tools, chat_template=None, tokenize=False, **kwargs
            )
            ids = tok.encode(text, add_special_tokens=False)
            renders.append({"text": text, "ids": ids})
        except Exception as exc:
            renders.append(error(exc))
    out["render"] = renders

    out["encode"] = [
        {
            "with": tok.encode(text, add_special_tokens=True),
            "without": tok.encode(text, add_special_tokens=False),
        }
        for text in cases["encode"]
    ]
    out["decode"] = [
        [tok.decode(ids, skip_special_tokens=False), tok.decode(ids, skip_special_tokens=True)]
        for ids in cases["decode"]
    ]

    detok = []
    for case in cases["detokenize"]:
        params = SamplingParams(
            stop=case["stop"],
            include_stop_str_in_output=case["include"],
            skip_special_tokens=case["skip"],
            spaces_between_special_tokens=case["spaces"],
            min_tokens=case["min_tokens"],
            max_tokens=1000,
        )
        request = EngineCoreRequest(
            "r", case["prompt"], None, params, None, time.time(), None, None, None
        )
        d = IncrementalDetokenizer.from_new_request(tok, request)
        steps, at = [], 0
        ids = case["ids"]
        for size in case["chunks"]:
            new = ids[at : at + size]
            at += size
            last = at >= len(ids)
            stop = d.update(list(new), case["terminated"] and last)
            finished = stop is not None or last
            steps.append([d.get_next_output_text(finished, True), stop, list(d.output_token_ids)])
            if finished:
                break
        detok.append(steps)
    out["detokenize"] = detok

    sampling = []
    so_config = StructuredOutputsConfig()
    for case in cases["sampling"]:
        body = case["body"]
        try:
            if case["endpoint"] == "chat":
                request: Any = ChatCompletionRequest(
                    model="m", messages=[{"role": "user", "content": "x"}], **body
                )
                requested = (
                    request.max_completion_tokens
                    if request.max_completion_tokens is not None
                    else request.max_tokens
                )
            else:
                request = CompletionRequest(model="m", prompt="x", **body)
                requested = request.max_tokens
            request.build_tok_params(mc)
            max_tokens = get_max_tokens(mc.max_model_len, requested, case["prompt_len"], defaults)
            sp = request.to_sampling_params(max_tokens, defaults)
            sp.verify(mc, None, so_config, tok)
            sp.update_from_generation_config(generation, tok.eos_token_id)
            sp.update_from_tokenizer(tok)
        except Exception as exc:
            sampling.append(error(exc))
            continue
        so = sp.structured_outputs
        sampling.append(
            {
                "n": sp.n,
                "temperature": sp.temperature,
                "top_p": sp.top_p,
                "top_k": sp.top_k,
                "min_p": sp.min_p,
                "presence_penalty": sp.presence_penalty,
                "frequency_penalty": sp.frequency_penalty,
                "repetition_penalty": sp.repetition_penalty,
                "seed": sp.seed,
                "stop": sp.stop,
                "stop_token_ids": sorted(sp.stop_token_ids or []),
                "ignore_eos": sp.ignore_eos,
                "max_tokens": sp.max_tokens,
                "min_tokens": sp.min_tokens,
                "logprobs": sp.logprobs,
                "prompt_logprobs": sp.prompt_logprobs,
                "skip_special_tokens": sp.skip_special_tokens,
                "include_stop_str_in_output": sp.include_stop_str_in_output,
                "output_kind": sp.output_kind.value,
                "output_text_buffer_length": sp.output_text_buffer_length,
                "logit_bias": (
                    None if sp.logit_bias is None else {str(k): v for k, v in sp.logit_bias.items()}
                ),
                "allowed_token_ids": sp.allowed_token_ids,
                "bad_words": sp.bad_words,
                "_eos_token_id": sp._eos_token_id,
                "_all_stop_token_ids": sorted(sp._all_stop_token_ids),
                "_bad_words_token_ids": sp._bad_words_token_ids,
                "structured_outputs": None
                if so is None
                else {
                    "json": so.json,
                    "regex": so.regex,
                    "choice": so.choice,
                    "grammar": so.grammar,
                    "json_object": so.json_object,
                    "_backend": so._backend,
                },
            }
        )
    out["sampling"] = sampling

    # What EngineCore does with an ADD's sampling params: msgspec decodes them into
    # SamplingParams, __post_init__ and its checks included, outside any error handling.
    import msgspec
    from vllm.v1.serial_utils import MsgpackDecoder

    decoder = MsgpackDecoder(SamplingParams)
    decoded = []
    for case in cases["sampling"]:
        ours = case.get("ours")
        if ours is None:
            decoded.append(None)
            continue
        if ours.get("logit_bias") is not None:
            ours["logit_bias"] = {int(k): v for k, v in ours["logit_bias"].items()}
        try:
            decoder.decode(msgspec.msgpack.encode(ours))
        except Exception as exc:
            decoded.append(f"{type(exc).__name__}: {exc}")
        else:
            decoded.append(None)
    out["engine_decode"] = decoded

    processor = object.__new__(LogprobsProcessor)
    processor.tokenizer = tok
    logprobs = []
    for case in cases["logprobs"]:
        strings = convert_ids_list_to_tokens(tok, case["ids"])
        logprobs.append(processor._verify_tokens(strings, case["ids"], case["context"]))
    out["logprobs"] = logprobs
    from vllm.v1.structured_output.utils import choice_as_grammar

    out["choice_grammar"] = [choice_as_grammar(c) for c in cases["choices"]]

    # Logprobs as the serving layer lays them out, from the rows EngineCore sends.
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.logprobs import append_logprobs_for_next_position

    chat = object.__new__(OpenAIServingChat)
    chat.return_tokens_as_token_ids = False
    completion = object.__new__(OpenAIServingCompletion)
    completion.return_tokens_as_token_ids = False
    formatted = []
    for case in cases["logprob_layout"]:
        steps: list[Any] = []
        sampled: list[int] = []
        for row in case["rows"]:
            processor.logprobs = steps
            strings = convert_ids_list_to_tokens(tok, row["ids"])
            strings = processor._verify_tokens(strings, row["ids"], sampled[-4:])
            append_logprobs_for_next_position(
                steps, row["ids"], row["logprobs"], strings, row["rank"], case["num"]
            )
            sampled.append(row["ids"][0])
        chat_out = chat._create_chat_logprobs(
            token_ids=sampled,
            top_logprobs=steps,
            tokenizer=tok,
            num_output_top_logprobs=case["num"],
        )
        completion_out = completion._create_completion_logprobs(
            token_ids=sampled,
            top_logprobs=steps,
            num_output_top_logprobs=case["num"],
            tokenizer=tok,
            initial_text_offset=case["offset"],
        )
        formatted.append(
            {
                "chat": chat_out.model_dump(mode="json", exclude_unset=True)["content"],
                "completion": completion_out.model_dump(mode="json", exclude_unset=True),
            }
        )
    out["logprob_layout"] = formatted
    return out


if __name__ == "__main__":
    main(*sys.argv[1:3])

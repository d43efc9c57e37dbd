"""The text layer against vLLM's own code, case by case: chat templates rendered and
tokenized, prompts encoded and decoded, incremental detokenization with stop strings (every
step of a chunked stream), sampling parameters lowered and validated, logprob token strings.

vLLM's answers come from ``text_reference.py`` run under the vLLM interpreter (one run for
all cases, both test models: the plain tiny Llama's text and the harder one's); no engine
is started. Skipped, saying how to run it, without vLLM.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.text_models import build_text_model
from tests.helpers.vllm_session import HOW_TO_RUN, START_GUARD, vllm_env, vllm_python
from trioserve.errors import TextInputError
from trioserve.text.assets import ModelText
from trioserve.text.detokenizer import IncrementalDetokenizer
from trioserve.text.logprob_format import chat_logprobs, completion_logprobs, position
from trioserve.text.logprobs import token_strings
from trioserve.text.prompts import chat_prompt
from trioserve.text.sampling import EngineLimits, lower
from trioserve.text.structured import choice_as_grammar
from trioserve.text.template import ChatOptions

HERE = Path(__file__).resolve().parent
MAX_MODEL_LEN = 512

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <now> & later",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "noop", "strict": True}},
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "n": [1, 2]}'},
}
RENDER = [
    {"messages": [{"role": "user", "content": "Hello!"}], "options": {}},
    {
        "messages": [
            {"role": "system", "content": "Be brief. Réponds en français 🙂"},
            {"role": "user", "content": [{"type": "text", "text": "日本語? "}, "plain"]},
        ],
        "options": {},
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": [{"type": "text", "text": "sunny"}], "tool_call_id": "1"},
        ],
        "tools": TOOLS,
        "options": {},
    },
    {
        "messages": [
            {"role": "developer", "content": "Rules"},
            {"role": "user", "content": "q"},
            {"role": "system", "content": "late system"},
        ],
        "options": {},
    },
    {
        "messages": [
            {"role": "user", "content": "Tell a story"},
            {"role": "assistant", "content": "Once upon a time "},
        ],
        "options": {"add_generation_prompt": False, "continue_final_message": True},
    },
    {
        "messages": [{"role": "user", "content": "no prompt"}],
        "options": {"add_generation_prompt": False},
    },
    {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
        "options": {},
    },
    {"messages": [{"role": "narrator", "content": "x"}], "options": {}},
    {
        "messages": [{"role": "user", "content": "x"}],
        "options": {"chat_template_kwargs": {"unused": 1, "bos_token": "[B]"}},
    },
]
ENCODE = [
    "",
    "Hello",
    " leading space",
    "Grüße aus Köln! Café, naïve",
    "中文测试 漢字 日本語",
    "Emoji 👩‍💻 👍🏽 🇫🇷 🦀",
    "<s>hi</s> <unk>",
    "<|user|>x<|end|><tool_call>{}</tool_call>",
]
SAMPLING: list[tuple[str, dict[str, Any], int]] = [
    ("chat", {}, 10),
    ("chat", {"temperature": 0}, 10),
    ("chat", {"temperature": 0.005, "top_k": 5}, 10),
    ("chat", {"max_tokens": 600}, 10),
    ("chat", {"max_tokens": 500}, 100),
    ("chat", {"max_completion_tokens": 20, "max_tokens": 30}, 10),
    ("chat", {}, MAX_MODEL_LEN),
    ("chat", {"n": 0}, 10),
    ("chat", {"n": 3, "temperature": 0}, 10),
    ("chat", {"n": 3, "seed": 5, "temperature": 0.8}, 10),
    ("chat", {"temperature": -0.5}, 10),
    ("chat", {"temperature": 2.5}, 10),
    ("chat", {"top_p": 0}, 10),
    ("chat", {"top_p": 1.5}, 10),
    ("chat", {"top_k": -5}, 10),
    ("chat", {"min_p": -0.1}, 10),
    ("chat", {"presence_penalty": 2.5}, 10),
    ("chat", {"frequency_penalty": -3}, 10),
    ("chat", {"repetition_penalty": 0}, 10),
    ("chat", {"min_tokens": 30, "max_tokens": 20}, 10),
    ("chat", {"stop": ["ok", ""]}, 10),
    ("chat", {"stop": ["abc", "de"], "include_stop_str_in_output": False}, 10),
    ("chat", {"stop": "abc", "include_stop_str_in_output": True}, 10),
    ("chat", {"stop_token_ids": [3, 3, 9999]}, 10),
    ("chat", {"stop_token_ids": [3, 4], "ignore_eos": True}, 10),
    ("chat", {"logprobs": True, "top_logprobs": 5}, 10),
    ("chat", {"logprobs": True, "top_logprobs": 25}, 10),
    ("chat", {"top_logprobs": 3}, 10),
    ("chat", {"prompt_logprobs": 2}, 10),
    ("chat", {"prompt_logprobs": 2, "stream": True}, 10),
    ("chat", {"stream": True}, 10),
    ("chat", {"logit_bias": {"5": 200, "6": -3.5}}, 10),
    ("chat", {"logit_bias": {"999999": 1}}, 10),
    ("chat", {"logit_bias": {"five": 1}}, 10),
    ("chat", {"allowed_token_ids": []}, 10),
    ("chat", {"allowed_token_ids": [1, 5, 99999]}, 10),
    ("chat", {"allowed_token_ids": [1, 5]}, 10),
    ("chat", {"bad_words": ["fox", " quick brown"]}, 10),
    ("chat", {"bad_words": [""]}, 10),
    ("chat", {"seed": -1}, 10),
    ("chat", {"response_format": {"type": "json_object"}}, 10),
    (
        "chat",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"type": "object"}},
            }
        },
        10,
    ),
    ("chat", {"structured_outputs": {"choice": ["yes", "no"]}}, 10),
    ("chat", {"structured_outputs": {"choice": []}}, 10),
    ("chat", {"structured_outputs": {"regex": "a+", "choice": ["a"]}}, 10),
    ("chat", {"structured_outputs": {"grammar": "  "}}, 10),
    ("completion", {}, 10),
    ("completion", {"max_tokens": None}, 10),
    ("completion", {"logprobs": 3, "echo": True}, 10),
    ("completion", {"logprobs": 21}, 10),
    ("completion", {"max_tokens": 0, "echo": True}, 10),
    ("completion", {"max_tokens": 0}, 10),
    ("completion", {"min_tokens": -1}, 10),
]
#: Compared field by field (the reference lists the same).
SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "ignore_eos", "max_tokens", "min_tokens", "logprobs",
    "prompt_logprobs", "skip_special_tokens", "include_stop_str_in_output", "output_kind",
    "output_text_buffer_length", "allowed_token_ids", "bad_words", "_eos_token_id",
    "_all_stop_token_ids", "_bad_words_token_ids",
)  # fmt: skip
CHOICES = [["yes", "no"], ['say "hi"', "back\\slash", "new\nline\ttab\x00\x7f", "Zürich 🙂"]]
DETOKENIZE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "漢字 🦀 日本語のテキスト。Grüße aus Köln!",
    "Emoji: 🙂 🚀 ✨ 👩‍💻 and € £ ¥ ©.",
    "中文测试：你好，世界！ Zürich façade",  # noqa: RUF001
]
STOPS = [[], ["fox"], ["。", "🚀"], ["ö", "lazy dog"], ["e", "xyz"], ["Zürich"]]


def _detokenize_cases(model: ModelText) -> list[dict[str, Any]]:
    rng = random.Random(25)
    specials = [model.tokenizer.token_to_id(t) for t in ("<s>", "</s>")]
    added = sorted(model.added_tokens)
    cases = []
    for text in DETOKENIZE_TEXTS:
        base = model.encode(text, add_special_tokens=False)
        for stop in STOPS:
            for _ in range(3):
                ids = list(base)
                if rng.random() < 0.5:  # special and added tokens in the middle
                    for _ in range(2):
                        ids.insert(rng.randrange(len(ids)), rng.choice(added))
                terminated = rng.random() < 0.5
                if terminated:
                    ids.append(specials[1])
                chunks = [rng.randint(1, 4) for _ in range(len(ids))]
                cases.append(
                    {
                        "prompt": [specials[0], *model.encode("Say:", add_special_tokens=False)],
                        "ids": ids,
                        "chunks": chunks,
                        "stop": stop,
                        "include": rng.random() < 0.3,
                        "skip": rng.random() < 0.7,
                        "spaces": rng.random() < 0.5,
                        "min_tokens": rng.choice([0, 0, 3]),
                        "terminated": terminated,
                    }
                )
    return cases


def _logprob_cases(model: ModelText) -> list[dict[str, Any]]:
    cases = []
    for text in DETOKENIZE_TEXTS:
        ids = model.encode(text, add_special_tokens=False)
        for i, token in enumerate(ids):
            alternatives = [token, (token * 7 + 3) % model.vocab_size, ids[i - 1]]
            cases.append({"ids": alternatives, "context": ids[max(0, i - 4) : i]})
    return cases


#: Values for the hostile sampling bodies: in range, out of range, at the edges (of the
#: JSON types a client may send: a string for a number is the HTTP layer's 422).
HOSTILE_VALUES: dict[str, list[Any]] = {
    "n": [-1, 0, 1, 2, 3],
    "temperature": [-1, 0, 0.005, 0.7, 2, 2.5],
    "top_p": [0, 1e-9, 0.5, 1, 1.5],
    "top_k": [-2, -1, 0, 5, 2.5],
    "min_p": [-0.1, 0, 0.5, 1, 1.1],
    "presence_penalty": [-2.5, -2, 0, 2, 2.1],
    "frequency_penalty": [-3, 0, 1.5],
    "repetition_penalty": [-1, 0, 0.5, 1.2, 1e9],
    "max_tokens": [0, 1, 10, MAX_MODEL_LEN - 5, MAX_MODEL_LEN + 1],
    "min_tokens": [-1, 0, 5, 700],
    "seed": [-1, 0, 7, 2**63 - 1, 2**63],
    "stop": ["", "a", ["a", ""], ["ab", "🙂"], []],
    "stop_token_ids": [[5], [-1], [10**6], [], [1, 1]],
    "ignore_eos": [True, False],
    "include_stop_str_in_output": [True, False],
    "skip_special_tokens": [True, False],
    "logprobs": [True, False],
    "top_logprobs": [-2, -1, 0, 5, 21],
    "prompt_logprobs": [-2, -1, 0, 3, 21],
    "logit_bias": [{"5": 1}, {"-3": 1}, {"100000": 2}, {"7": -500}],
    "allowed_token_ids": [[], [3, 4], [-1], [10**6]],
    "bad_words": [[""], ["fox"], ["Zürich", " 日本"]],
}
HOSTILE_BODIES = 160


def _hostile_sampling(model: ModelText) -> list[tuple[str, dict[str, Any], int]]:
    rng = random.Random(2025)
    cases = []
    for _ in range(HOSTILE_BODIES):
        endpoint = rng.choice(["chat", "chat", "completion"])
        names = rng.sample(sorted(HOSTILE_VALUES), rng.randint(1, 5))
        body = {name: rng.choice(HOSTILE_VALUES[name]) for name in names}
        if endpoint == "completion":
            if "logprobs" in body:
                body["logprobs"] = rng.choice([0, 3, 21, -2])
            body.pop("top_logprobs", None)
        cases.append((endpoint, body, rng.choice([1, 10, MAX_MODEL_LEN - 3])))
    return cases


def _with_ours(model: ModelText, case: dict[str, Any]) -> dict[str, Any]:
    """The case, with the params trioserve would send the engine (None: refused)."""
    try:
        sampling = lower(
            case["body"],
            endpoint=case["endpoint"],
            prompt_len=case["prompt_len"],
            model=model,
            limits=EngineLimits(MAX_MODEL_LEN),
            stream=bool(case["body"].get("stream")),
        )
    except TextInputError:
        return {**case, "ours": None}
    params = dict(sampling.params)
    if params.get("logit_bias") is not None:
        params["logit_bias"] = {str(k): v for k, v in params["logit_bias"].items()}
    return {**case, "ours": params}


def _layout_cases(model: ModelText) -> list[dict[str, Any]]:
    """Generated positions as EngineCore reports them: the sampled id (a text's tokens, so
    that characters split across tokens come up), then ``num`` top ids by rank."""
    rng = random.Random(7)
    cases = []
    for text in DETOKENIZE_TEXTS:
        for num in (0, 1, 3):
            rows = []
            for token in model.encode(text, add_special_tokens=False):
                tops = [rng.randrange(model.vocab_size) for _ in range(num)]
                if tops and rng.random() < 0.3:
                    tops[0] = token  # the sampled token is the top one too
                values = sorted((rng.uniform(-30, 0) for _ in range(num + 1)), reverse=True)
                rows.append({"ids": [token, *tops], "logprobs": values, "rank": rng.randint(1, 50)})
            cases.append({"rows": rows, "num": num, "offset": rng.choice([0, 17])})
    return cases


def _cases(model: ModelText, directory: Path) -> dict[str, Any]:
    return {
        "dir": str(directory),
        "max_model_len": MAX_MODEL_LEN,
        "render": RENDER,
        "encode": ENCODE,
        "decode": [model.encode(t, add_special_tokens=True) for t in ENCODE]
        + [sorted(model.added_tokens), [0, 1, 2, 0]],
        "detokenize": _detokenize_cases(model),
        "sampling": [
            _with_ours(model, {"endpoint": e, "body": b, "prompt_len": n})
            for e, b, n in [*SAMPLING, *_hostile_sampling(model)]
        ],
        "logprobs": _logprob_cases(model),
        "choices": CHOICES,
        "logprob_layout": _layout_cases(model),
    }


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory):
    python = vllm_python()
    if python is None:
        pytest.skip(HOW_TO_RUN)
    where = tmp_path_factory.mktemp("text-parity")
    models = {
        "plain": build_text_model(where / "plain", harder=False),
        "harder": build_text_model(where / "harder", harder=True),
    }
    loaded = {name: ModelText.load(d) for name, d in models.items()}
    cases = {name: _cases(loaded[name], d) for name, d in models.items()}
    (where / "cases.json").write_text(json.dumps(cases))
    subprocess.run(
        [
            python,
            str(HERE / "text_reference.py"),
            str(where / "cases.json"),
            str(where / "out.json"),
        ],
        check=True,
        env=vllm_env(),
        timeout=START_GUARD,
        capture_output=True,
    )
    answers = json.loads((where / "out.json").read_text())
    return {name: (loaded[name], cases[name], answers[name]) for name in models}


MODELS = ["plain", "harder"]


@pytest.mark.parametrize("name", MODELS)
def test_chat_rendering_and_tokens_match_vllm(parity, name):
    model, cases, answers = parity[name]
    problems = []
    for case, expected in zip(cases["render"], answers["render"], strict=True):
        o = case["options"]
        options = ChatOptions(
            add_generation_prompt=o.get("add_generation_prompt", True),
            continue_final_message=o.get("continue_final_message", False),
            tools=case.get("tools"),
            chat_template_kwargs=o.get("chat_template_kwargs"),
        )
        try:
            prompt = chat_prompt(model, case["messages"], options)
        except TextInputError as exc:
            got: dict[str, Any] = {"error": exc.message}
        else:
            got = {"text": prompt.text, "ids": prompt.token_ids}
        if "error" in expected:
            if "error" not in got:
                problems.append((case, expected, got))
        elif got != expected:
            problems.append((case, expected, got))
    assert problems == [], "\n".join(map(repr, problems))


@pytest.mark.parametrize("name", MODELS)
def test_encode_and_decode_match_vllm(parity, name):
    model, cases, answers = parity[name]
    for text, expected in zip(cases["encode"], answers["encode"], strict=True):
        assert model.encode(text, add_special_tokens=True) == expected["with"], text
        assert model.encode(text, add_special_tokens=False) == expected["without"], text
    for ids, (kept, skipped) in zip(cases["decode"], answers["decode"], strict=True):
        assert model.decode(ids) == kept
        assert model.decode(ids, skip_special_tokens=True) == skipped


@pytest.mark.parametrize("name", MODELS)
def test_every_detokenizer_step_matches_vllm(parity, name):
    model, cases, answers = parity[name]
    problems = []
    for case, expected in zip(cases["detokenize"], answers["detokenize"], strict=True):
        d = IncrementalDetokenizer(
            model,
            case["prompt"],
            stop=case["stop"],
            include_stop_str_in_output=case["include"],
            min_tokens=case["min_tokens"],
            skip_special_tokens=case["skip"],
            spaces_between_special_tokens=case["spaces"],
        )
        steps, at = [], 0
        for size in case["chunks"]:
            new = case["ids"][at : at + size]
            at += size
            last = at >= len(case["ids"])
            stop = d.update(new, case["terminated"] and last)
            finished = stop is not None or last
            steps.append([d.next_text(finished), stop, list(d.token_ids)])
            if finished:
                break
        if steps != expected:
            problems.append((case, expected, steps))
    assert problems[:3] == [], f"{len(problems)} of {len(cases['detokenize'])} differ"


@pytest.mark.parametrize("name", MODELS)
def test_sampling_lowering_and_refusals_match_vllm(parity, name):
    model, cases, answers = parity[name]
    problems: list[Any] = []
    limits = EngineLimits(MAX_MODEL_LEN)
    for case, expected in zip(cases["sampling"], answers["sampling"], strict=True):
        body = case["body"]

        try:
            sampling = lower(
                body,
                endpoint=case["endpoint"],
                prompt_len=case["prompt_len"],
                model=model,
                limits=limits,
                stream=bool(body.get("stream")),
            )
        except TextInputError as exc:
            if "error" not in expected:
                problems.append((case, expected, exc.message))
            continue
        if "error" in expected:
            problems.append((case, expected, "accepted"))
            continue
        p = sampling.params
        got: dict[str, Any] = {field: p.get(field) for field in SAMPLING_FIELDS}
        got["n"] = sampling.n
        got["stop_token_ids"] = sorted(p["stop_token_ids"])
        bias = p["logit_bias"]
        got["logit_bias"] = None if bias is None else {str(k): v for k, v in bias.items()}
        so = p["structured_outputs"]
        want_so = expected["structured_outputs"]
        got["structured_outputs"] = (
            so if so is None or want_so is None else {k: so[k] for k in want_so}
        )
        want = {k: expected[k] for k in got}
        if got != want:
            diff = {k: (want[k], got[k]) for k in got if got[k] != want[k]}
            problems.append((case, diff))
    assert problems == [], "\n".join(map(repr, problems))


@pytest.mark.parametrize("name", MODELS)
def test_logprob_token_strings_match_vllm(parity, name):
    model, cases, answers = parity[name]
    problems = []
    for case, expected in zip(cases["logprobs"], answers["logprobs"], strict=True):
        got = token_strings(model, case["ids"], case["context"])
        if got != expected:
            problems.append((case, expected, got))
    assert problems == [], "\n".join(map(repr, problems))


def test_choices_become_vllms_grammar(parity):
    _, cases, answers = parity["plain"]
    assert [choice_as_grammar(c) for c in cases["choices"]] == answers["choice_grammar"]


@pytest.mark.parametrize("name", MODELS)
def test_every_accepted_request_decodes_in_the_engine(parity, name):
    """What trioserve would send, decoded as EngineCore decodes an ADD's sampling params:
    none fails (one failure there kills the engine's input thread)."""
    _, cases, answers = parity[name]
    sent = [c for c in cases["sampling"] if c["ours"] is not None]
    assert len(sent) > 20  # the hostile bodies do not all get refused
    failures = [
        (case["body"], error)
        for case, error in zip(cases["sampling"], answers["engine_decode"], strict=True)
        if error is not None
    ]
    assert failures == []


@pytest.mark.parametrize("name", MODELS)
def test_logprobs_are_laid_out_as_vllm_lays_them_out(parity, name):
    model, cases, answers = parity[name]
    problems = []
    for case, expected in zip(cases["logprob_layout"], answers["logprob_layout"], strict=True):
        positions, sampled = [], []
        for row in case["rows"]:
            positions.append(
                position(model, row["ids"], row["logprobs"], row["rank"], case["num"], sampled)
            )
            sampled.append(row["ids"][0])
        chat = chat_logprobs(sampled, positions, case["num"])
        completion = completion_logprobs(sampled, positions, case["num"], case["offset"])
        if chat != expected["chat"]:
            problems.append(("chat", case["num"], expected["chat"][:3], chat[:3]))
        if completion != expected["completion"]:
            problems.append(("completion", case["num"], expected["completion"], completion))
    assert problems == [], "\n".join(map(repr, problems[:4]))

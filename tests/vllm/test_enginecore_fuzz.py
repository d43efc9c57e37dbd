"""Nothing a client sends can wedge the engine (issue 25, item 3): hostile sampling
parameters, fuzzed (hypothesis, seeded and bounded), through the text layer's validation and
the EngineCore client into the session's real EngineCore.

vLLM's EngineCore decodes an ADD outside its error handling: one request whose sampling
parameters its own checks refuse kills the engine's input thread, and the engine then
ignores every later request, silently. So after every hostile body, a normal request sent
after it on the same socket must still get its answer: what text's validator lets through,
the engine must take.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.helpers.enginecore_session import Collect, HeadlessEngine, request
from trioserve.enginecore import codec
from trioserve.errors import InputError
from trioserve.http.errors import http_error
from trioserve.text.assets import ModelText
from trioserve.text.sampling import EngineLimits, lower

pytestmark = pytest.mark.integration

PROMPT = [0, 57, 101, 33, 250, 7]
#: Bodies per example, and examples: a bounded run (each accepted body is one engine
#: request, each with a probe after it).
BODIES = 12
EXAMPLES = 4

_ints = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([-(2**63), 2**63 - 1, 2**64, -(2**70), 4096, 4095, 16384, 16385]),
)
_floats = st.one_of(
    st.floats(-3.0, 3.0),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e-6, 1e-3, 2.0, 2.0000001, 1e300]),
)
_scalars = st.one_of(_ints, _floats, st.booleans(), st.none(), st.text(max_size=4))
_hostile = st.one_of(
    _scalars,
    st.lists(st.one_of(_ints, st.text(max_size=3)), max_size=4),
    st.dictionaries(
        st.one_of(st.text(max_size=3), st.integers(-2, 600).map(str)), _scalars, max_size=3
    ),
)
#: Each parameter: hostile values, and sometimes a value of its own kind.
PARAMETERS: dict[str, st.SearchStrategy[Any]] = {
    "n": _ints,
    "temperature": _floats,
    "top_p": _floats,
    "top_k": _ints,
    "min_p": _floats,
    "presence_penalty": _floats,
    "frequency_penalty": _floats,
    "repetition_penalty": _floats,
    "max_tokens": _ints,
    "min_tokens": _ints,
    "seed": _ints,
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3)),
    "stop_token_ids": st.lists(_ints, max_size=3),
    "logprobs": st.one_of(_ints, st.booleans()),
    "top_logprobs": _ints,
    "prompt_logprobs": _ints,
    "logit_bias": st.dictionaries(st.integers(-2, 600).map(str), _floats, max_size=3),
    "allowed_token_ids": st.lists(_ints, max_size=3),
    "bad_words": st.lists(st.text(max_size=3), max_size=2),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "spaces_between_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "stream_interval": _ints,
    "logprob_token_ids": st.lists(_ints, max_size=3),
}


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    endpoint = draw(st.sampled_from(["chat", "completion"]))
    names = draw(st.lists(st.sampled_from(sorted(PARAMETERS)), min_size=1, max_size=6, unique=True))
    body = {name: draw(st.one_of(PARAMETERS[name], _hostile)) for name in names}
    return endpoint, body


#: What the probe on these machines found to wedge the engine, and their neighbours.
KNOWN = [
    ("completion", {"n": 0}),
    ("completion", {"temperature": -1.0}),
    ("completion", {"top_p": 0.0}),
    ("completion", {"max_tokens": 0}),
    ("completion", {"min_tokens": 5, "max_tokens": 2}),
    ("chat", {"stop": [""]}),
    ("completion", {"logprobs": -2}),
    ("completion", {"repetition_penalty": math.nan}),
    ("completion", {"seed": 2**64}),
    ("completion", {"n": 2, "temperature": 0.0}),
]


async def _send_and_probe(
    client: Any, model: ModelText, limits: EngineLimits, cases: list[tuple[str, dict[str, Any]]]
) -> tuple[int, int]:
    """Each case through text's validation; an accepted one to the engine, then a probe.
    Returns (accepted, refused)."""
    accepted = refused = 0
    for index, (endpoint, body) in enumerate(cases):
        try:
            sampling = lower(
                body, endpoint=endpoint, prompt_len=len(PROMPT), model=model, limits=limits
            )
        except InputError as refusal:
            assert http_error(refusal).status == 400, (body, refusal)
            refused += 1
            continue
        accepted += 1
        # What text accepts, the codec encodes (its types are vLLM's) ...
        params = sampling.choice(0)
        hostile = request(f"hostile-{index}", PROMPT)
        hostile.sampling_params = codec.sampling_params(params)
        sink = Collect()
        client.add(hostile, sink)
        # ... and the engine takes: a normal request sent after it is answered.
        probe = Collect()
        client.add(request(f"probe-{index}", PROMPT, max_tokens=2), probe)
        assert len(await probe.answer()) == 2, (body, params)
        if not sink.ended.is_set():
            client.abort([hostile.request_id])
        elif sink.finish_reason == codec.FinishReason.ERROR:
            pytest.fail(f"the engine refused what text accepted: {body} -> {params}")
        assert client.failure is None
    return accepted, refused


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a wedged engine stays wedged
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(cases=KNOWN)
@given(cases=st.lists(bodies(), min_size=BODIES, max_size=BODIES))
async def test_no_sampling_parameters_wedge_the_engine(enginecore: HeadlessEngine, cases):
    model = ModelText.load(enginecore.model_dir)
    limits = EngineLimits(max_model_len=enginecore.ready.max_model_len)
    async with enginecore.client() as client:
        accepted, refused = await _send_and_probe(client, model, limits, cases)
    if cases is KNOWN:
        # Text refuses every one the engine would have died of.
        assert (accepted, refused) == (0, len(KNOWN))


async def test_the_fuzzed_bodies_reach_the_engine(enginecore: HeadlessEngine):
    """Not vacuous: bodies of the fuzzer's kinds that are valid reach the engine and are
    answered (a fuzz whose every body text refused would prove nothing)."""
    model = ModelText.load(enginecore.model_dir)
    limits = EngineLimits(max_model_len=enginecore.ready.max_model_len)
    valid = [
        ("completion", {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3, "max_tokens": 4}),
        ("chat", {"logprobs": True, "top_logprobs": 3, "max_tokens": 3}),
        ("completion", {"stop": ["x"], "min_tokens": 1, "max_tokens": 4, "logit_bias": {"5": 2.0}}),
        ("completion", {"n": 2, "temperature": 1.0, "bad_words": ["ab"], "max_tokens": 2}),
    ]
    async with enginecore.client() as client:
        with trio.fail_after(600):
            assert await _send_and_probe(client, model, limits, valid) == (len(valid), 0)

"""trioserve's EngineCore codec held to the installed vLLM's own structs and encoder.

Run by the vLLM interpreter (``python tests/helpers/enginecore_wire.py``, trioserve
importable), it runs every case and prints one JSON object: case name → ``"ok"`` or the
traceback. ``tests/vllm/test_enginecore_codec.py`` asserts each case, by name; this module
imports vllm only inside the cases, so the test can list them without vllm.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from trioserve.errors import ProtocolVersionError

CASES: dict[str, Callable[[], None]] = {}


def case(function: Callable[[], None]) -> Callable[[], None]:
    CASES[function.__name__] = function
    return function


# -- the shapes: names, order and defaults of every mirrored struct -------------------------


def _vllm_fields(cls: type) -> list[tuple[str, Any]]:
    import msgspec

    if dataclasses.is_dataclass(cls):
        fields = []
        for f in dataclasses.fields(cls):
            default: Any = _REQUIRED if f.default is dataclasses.MISSING else f.default
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            fields.append((f.name, default))
        return fields
    if hasattr(cls, "_fields"):  # a NamedTuple
        defaults = getattr(cls, "_field_defaults", {})
        return [(name, defaults.get(name, _REQUIRED)) for name in cls._fields]
    return [(f.name, _default(f)) for f in msgspec.structs.fields(cls)]


_REQUIRED = "<required>"


def _default(field: Any) -> Any:
    import msgspec

    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    if field.default is msgspec.NODEFAULT:
        return _REQUIRED
    return field.default


def _ours(cls: type) -> list[tuple[str, Any]]:
    import msgspec

    return [(f.name, _default(f)) for f in msgspec.structs.fields(cls)]


def _plain(value: Any) -> Any:
    import enum

    import msgspec

    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, msgspec.Struct) or dataclasses.is_dataclass(value):
        return msgspec.to_builtins(value)
    return value


def _within(ours: Any, theirs: Any) -> bool:
    """``ours`` equals ``theirs``, or is a map whose every key ``theirs`` has, equal."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return all(k in theirs and _within(v, theirs[k]) for k, v in ours.items())
    return bool(ours == theirs)


def _same_shape(ours: type, theirs: type, *, keep_order: bool, partial: bool = False) -> None:
    mine = [(name, _plain(default)) for name, default in _ours(ours)]
    vllm = [(name, _plain(default)) for name, default in _vllm_fields(theirs)]
    if partial:  # a map whose other keys the decoder skips: ours must be a subset
        theirs_by_name = dict(vllm)
        missing = [name for name, _ in mine if name not in theirs_by_name]
        assert not missing, f"{ours.__name__}: vLLM has no fields {missing}"
        wrong = [(n, d, theirs_by_name[n]) for n, d in mine if not _within(d, theirs_by_name[n])]
        assert not wrong, f"{ours.__name__}: defaults differ (name, ours, vLLM's): {wrong}"
        return
    if not keep_order:
        mine, vllm = sorted(mine), sorted(vllm)
    assert mine == vllm, (
        f"{ours.__name__} is not vLLM's {theirs.__module__}.{theirs.__qualname__}:\n"
        f"ours:   {mine}\nvLLM's: {vllm}"
    )


@case
def request_structs_mirror_vllms_field_by_field() -> None:
    from vllm import sampling_params as vsp
    from vllm.v1 import engine as ve

    from trioserve.enginecore import codec

    _same_shape(codec.EngineCoreRequest, ve.EngineCoreRequest, keep_order=True)
    _same_shape(codec.SamplingParams, vsp.SamplingParams, keep_order=False)
    _same_shape(codec.StructuredOutputsParams, vsp.StructuredOutputsParams, keep_order=False)
    _same_shape(codec.RepetitionDetectionParams, vsp.RepetitionDetectionParams, keep_order=False)


@case
def output_structs_mirror_vllms_field_by_field() -> None:
    from vllm.v1 import engine as ve
    from vllm.v1 import outputs as vo
    from vllm.v1.metrics import stats

    from trioserve.enginecore import codec

    _same_shape(codec.EngineCoreOutputs, ve.EngineCoreOutputs, keep_order=True)
    _same_shape(codec.EngineCoreOutput, ve.EngineCoreOutput, keep_order=True)
    _same_shape(codec.UtilityOutput, ve.UtilityOutput, keep_order=True)
    _same_shape(codec.EngineCoreEvent, ve.EngineCoreEvent, keep_order=True)
    _same_shape(codec.Logprobs, vo.LogprobsLists, keep_order=True)
    _same_shape(codec.PromptLogprobs, vo.LogprobsTensors, keep_order=True)
    _same_shape(codec.PrefillStats, stats.PrefillStats, keep_order=False)
    _same_shape(codec.SchedulerStats, stats.SchedulerStats, keep_order=False, partial=True)
    _same_shape(codec.PrefixCacheStats, stats.PrefixCacheStats, keep_order=False, partial=True)


@case
def handshake_structs_mirror_vllms_field_by_field() -> None:
    from vllm.v1 import engine as ve
    from vllm.v1.engine import utils

    from trioserve.enginecore import codec

    _same_shape(codec.EngineCoreReadyResponse, ve.EngineCoreReadyResponse, keep_order=False)
    _same_shape(codec.EngineAddresses, utils.EngineZmqAddresses, keep_order=False)
    _same_shape(codec.HandshakeInit, utils.EngineHandshakeMetadata, keep_order=False)


@case
def constants_are_vllms() -> None:
    from vllm.v1 import engine as ve
    from vllm.v1 import serial_utils
    from vllm.v1.engine.core import EngineCoreProc

    from trioserve.enginecore import codec

    assert codec.ENGINE_CORE_DEAD == EngineCoreProc.ENGINE_CORE_DEAD
    for kind in codec.RequestType:
        assert ve.EngineCoreRequestType[kind.name].value == kind.value, kind
    assert [(r.name, r.value) for r in codec.FinishReason] == [
        (r.name, r.value) for r in ve.FinishReason
    ]
    assert codec.FINISH_REASON_NAMES == ve.FINISH_REASON_STRINGS
    assert codec.EXT_RAW_VIEW == serial_utils.CUSTOM_TYPE_RAW_VIEW
    import vllm

    assert codec.vllm_version_supported(vllm.__version__), vllm.__version__


# -- requests: vLLM's encoding decoded by us, ours decoded by vLLM -------------------------


def _every_sampling_field() -> dict[str, Any]:
    """A value other than the default for every field the engine reads (what a client's
    request can set, and what the text layer fills in)."""
    return {
        "n": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "repetition_penalty": 1.1,
        "temperature": 0.7,
        "watermarking": False,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 1234,
        "stop": ["\n\n", "END"],
        "stop_token_ids": [7, 8],
        "ignore_eos": True,
        "max_tokens": 77,
        "min_tokens": 3,
        "logprobs": 5,
        "prompt_logprobs": 2,
        "prompt_logprob_start": 1,
        "logprob_token_ids": [11, 12],
        "flat_logprobs": True,
        "detokenize": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "include_stop_str_in_output": True,
        "output_kind": 1,
        "stream_interval": 4,
        "skip_clone": True,
        "output_text_buffer_length": 3,
        "_eos_token_id": 2,
        "_all_stop_token_ids": {2, 7, 8},
        "_watermarking_skipped": True,
        "logit_bias": {5: -1.5, 6: 2.0},
        "allowed_token_ids": [1, 2, 5, 6, 7, 8],
        "extra_args": {"a": [1, "b"], "c": {"d": 2.5}},
        "bad_words": ["nope"],
        "_bad_words_token_ids": [[9, 10]],
        "skip_reading_prefix_cache": True,
        "thinking_token_budget": 50,
        "routed_experts_prompt_start": 2,
        "trace_decode_token_ids": [3, 4],
    }


def _ours_request(sampling: Any) -> Any:
    from trioserve.enginecore import codec

    return codec.EngineCoreRequest(
        request_id="req-1",
        prompt_token_ids=[1, 2, 3, 4],
        mm_features=None,
        sampling_params=sampling,
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt="salt",
        data_parallel_rank=0,
        prompt_is_token_ids=[True, True, True, True],
        client_index=1,
        current_wave=2,
        priority=-3,
        trace_headers={"traceparent": "00-abc-def-01"},
        resumable=True,
        external_req_id="user-req",
        reasoning_ended=False,
        reasoning_parser_kwargs={"k": "v"},
        abort_immediately=False,
        session_id="session",
    )


@case
def our_request_with_every_field_set_is_decoded_by_vllm() -> None:
    import numpy as np
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder

    from trioserve.enginecore import codec

    fields = _every_sampling_field()
    sampling = codec.sampling_params(fields)
    sampling.structured_outputs = codec.StructuredOutputsParams(regex="[a-z]+")
    sampling.structured_outputs._backend = "xgrammar"
    sampling.repetition_detection = codec.RepetitionDetectionParams(4, 2, 3)
    sampling.prompt_logprob_token_ids = codec.WireArray.of("q", [2, 2], [1, 2, 3, -1])
    ours = _ours_request(sampling)
    frames = codec.encode_add(ours)
    assert frames[0] == b"\x00"
    theirs = MsgpackDecoder(EngineCoreRequest).decode(frames[1:])

    for name in codec.EngineCoreRequest.__struct_fields__:
        if name == "sampling_params":
            continue
        assert getattr(theirs, name) == getattr(ours, name), name
    sp = theirs.sampling_params
    for name, value in fields.items():
        got = getattr(sp, name)
        got = got.value if hasattr(got, "value") and name == "output_kind" else got
        assert got == value, (name, got, value)
    assert sp.structured_outputs.regex == "[a-z]+"
    assert sp.structured_outputs._backend == "xgrammar"
    assert (sp.repetition_detection.max_pattern_size, sp.repetition_detection.min_count) == (
        4,
        3,
    )
    assert np.array_equal(sp.prompt_logprob_token_ids, np.array([[1, 2], [3, -1]]))


@case
def vllms_request_with_every_field_set_is_decoded_by_us() -> None:
    from vllm.sampling_params import (
        RepetitionDetectionParams,
        SamplingParams,
        StructuredOutputsParams,
    )
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackEncoder

    from trioserve.enginecore import codec

    fields = _every_sampling_field()
    kwargs = {k: v for k, v in fields.items() if not k.startswith("_")}
    kwargs.pop("output_kind")
    kwargs.pop("output_text_buffer_length")
    sp = SamplingParams(
        **kwargs,
        structured_outputs=StructuredOutputsParams(json={"type": "object"}),
        repetition_detection=RepetitionDetectionParams(4, 2, 3),
    )
    sp.structured_outputs._backend = "guidance"
    sp._eos_token_id = 2
    sp._all_stop_token_ids.add(2)
    sp._bad_words_token_ids = [[9, 10]]
    theirs = EngineCoreRequest(
        "req-2", [5, 6], None, sp, None, time.time(), None, "salt", 0,
        client_index=3, priority=4, trace_headers={"a": "b"}, session_id="s",
    )  # fmt: skip
    frames = MsgpackEncoder().encode(theirs)
    ours = codec.decode_request(list(frames))
    for name in codec.EngineCoreRequest.__struct_fields__:
        if name in ("sampling_params", "mm_features", "pooling_params", "lora_request"):
            continue
        assert getattr(ours, name) == getattr(theirs, name), name
    got = ours.sampling_params
    assert got is not None
    for name in kwargs:
        assert getattr(got, name) == getattr(sp, name), (name, getattr(got, name))
    assert got._eos_token_id == 2 and got._all_stop_token_ids == {2, 7, 8}
    assert got._bad_words_token_ids == [[9, 10]]
    assert got.structured_outputs is not None
    assert got.structured_outputs.json == {"type": "object"}
    assert got.structured_outputs._backend == "guidance"
    assert got.repetition_detection == codec.RepetitionDetectionParams(4, 2, 3)
    # ... and back: vLLM decodes our encoding of what we decoded to what it sent.
    from vllm.v1.serial_utils import MsgpackDecoder

    again = MsgpackDecoder(EngineCoreRequest).decode(codec.encode_add(ours)[1:])
    assert again.sampling_params == sp
    assert again.request_id == "req-2" and again.client_index == 3


@case
def sampling_params_with_only_defaults_encode_as_vllms_do() -> None:
    import msgspec
    from vllm.sampling_params import SamplingParams

    from trioserve.enginecore import codec

    # A fresh vLLM SamplingParams has been through __post_init__ (stop=[] and so on);
    # what vLLM's own frontend sends then is what ours decodes to, and vice versa.
    theirs = msgspec.msgpack.decode(msgspec.msgpack.encode(SamplingParams(max_tokens=5)))
    ours = msgspec.msgpack.decode(msgspec.msgpack.encode(codec.sampling_params(theirs)))
    assert ours == theirs, (ours, theirs)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(codec.SamplingParams())) == {}


@case
def a_sampling_value_of_the_wrong_type_is_refused_before_the_wire() -> None:
    from trioserve.enginecore import codec

    for bad in ({"n": "2"}, {"max_tokens": 1.5}, {"stop_token_ids": ["a"]}, {"top_p": None}):
        try:
            codec.sampling_params(bad)
        except ValueError as exc:
            assert next(iter(bad)) in str(exc), exc
        else:
            raise AssertionError(f"{bad} was accepted")


# -- outputs: vLLM's encoding decoded by us ------------------------------------------------


def _vllm_outputs(num_logprobs: int, positions: int) -> Any:
    import numpy as np
    import torch
    from vllm.v1.engine import (
        EngineCoreEvent,
        EngineCoreEventType,
        EngineCoreOutput,
        EngineCoreOutputs,
        FinishReason,
        UtilityOutput,
    )
    from vllm.v1.metrics.stats import PrefillStats, PrefixCacheStats, SchedulerStats
    from vllm.v1.outputs import LogprobsLists, LogprobsTensors
    from vllm.v1.serial_utils import UtilityResult

    width = num_logprobs + 1
    token_ids = np.arange(positions * width, dtype=np.int32).reshape(positions, width)
    logprobs = -np.linspace(0.1, 5.0, positions * width, dtype=np.float32).reshape(positions, width)
    ranks = np.arange(1, positions + 1, dtype=np.int32)
    prefill = PrefillStats()
    prefill.set(4, 1, 0)
    prompt = LogprobsTensors(
        torch.arange(3 * width, dtype=torch.int32).reshape(3, width),
        -torch.ones(3, width, dtype=torch.float32),
        torch.tensor([1, 2, 3], dtype=torch.int32),
    )
    outputs = [
        EngineCoreOutput(
            "a",
            list(range(positions)),
            new_logprobs=LogprobsLists(token_ids, logprobs, ranks, None),
            new_prompt_logprobs_tensors=prompt,
            events=[
                EngineCoreEvent.new_event(EngineCoreEventType.QUEUED, 1.5),
                EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED, 2.5),
            ],
            prefill_stats=prefill,
        ),
        EngineCoreOutput("b", [42], finish_reason=FinishReason.STOP, stop_reason=42),
        EngineCoreOutput("c", [], finish_reason=FinishReason.ERROR),
        EngineCoreOutput("d", [1, 2], finish_reason=FinishReason.LENGTH, num_nans_in_logits=1),
        EngineCoreOutput("e", [3], finish_reason=FinishReason.STOP, stop_reason="###"),
    ]
    stats = SchedulerStats(
        num_running_reqs=3,
        num_waiting_reqs=2,
        num_skipped_waiting_reqs=1,
        step_counter=9,
        kv_cache_usage=0.25,
        prefix_cache_stats=PrefixCacheStats(requests=2, queries=10, hits=4),
    )
    return EngineCoreOutputs(
        engine_index=0,
        outputs=outputs,
        scheduler_stats=stats,
        utility_output=UtilityOutput(7, result=UtilityResult(("generate",))),
        finished_requests={"b", "c", "d"},
        weight_version="v1",
    )


def _check_outputs(num_logprobs: int, positions: int, *, expect_frames: bool) -> None:
    from vllm.v1.serial_utils import MsgpackEncoder

    from trioserve.enginecore import codec

    theirs = _vllm_outputs(num_logprobs, positions)
    frames = [bytes(f) for f in MsgpackEncoder().encode(theirs)]
    assert (len(frames) > 1) == expect_frames, len(frames)
    ours = codec.decode_outputs(frames)
    assert [o.request_id for o in ours.outputs] == ["a", "b", "c", "d", "e"]
    a, b, c, d, e = ours.outputs
    t = theirs.outputs[0]
    assert a.new_token_ids == t.new_token_ids
    assert a.new_logprobs is not None
    assert a.new_logprobs.logprob_token_ids.tolist() == t.new_logprobs.logprob_token_ids.tolist()
    assert a.new_logprobs.logprobs.tolist() == t.new_logprobs.logprobs.tolist()
    assert (
        a.new_logprobs.sampled_token_ranks.tolist() == t.new_logprobs.sampled_token_ranks.tolist()
    )
    p = a.new_prompt_logprobs_tensors
    assert p is not None
    assert p.logprob_token_ids.tolist() == t.new_prompt_logprobs_tensors.logprob_token_ids.tolist()
    assert p.logprobs.tolist() == t.new_prompt_logprobs_tensors.logprobs.tolist()
    assert p.selected_token_ranks.tolist() == [1, 2, 3]
    assert [(ev.type, ev.timestamp) for ev in a.events or []] == [(1, 1.5), (2, 2.5)]
    assert a.prefill_stats == codec.PrefillStats(4, 3, 1, 1, 0, 0)
    assert a.finish_reason is None
    assert (b.finish_reason, b.stop_reason) == (codec.FinishReason.STOP, 42)
    assert (c.finish_reason, c.new_token_ids) == (codec.FinishReason.ERROR, [])
    assert (d.finish_reason, d.num_nans_in_logits) == (codec.FinishReason.LENGTH, 1)
    assert e.stop_reason == "###"
    stats = ours.scheduler_stats
    assert stats is not None
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (3, 2, 0.25)
    assert (stats.num_skipped_waiting_reqs, stats.step_counter) == (1, 9)
    assert stats.prefix_cache_stats == codec.PrefixCacheStats(False, 2, 10, 4)
    assert ours.utility_output is not None
    assert (ours.utility_output.call_id, ours.utility_output.value) == (7, ["generate"])
    assert sorted(ours.finished_requests or []) == ["b", "c", "d"]
    assert ours.timestamp == theirs.timestamp and ours.weight_version == "v1"


@case
def vllms_outputs_with_small_logprobs_inline_are_decoded_by_us() -> None:
    _check_outputs(num_logprobs=1, positions=2, expect_frames=False)


@case
def vllms_outputs_with_large_logprobs_in_extra_frames_are_decoded_by_us() -> None:
    _check_outputs(num_logprobs=20, positions=8, expect_frames=True)


@case
def vllms_utility_answers_are_decoded_by_us() -> None:
    from vllm.v1.engine import EngineCoreOutputs, UtilityOutput
    from vllm.v1.serial_utils import MsgpackEncoder, UtilityResult

    from trioserve.enginecore import codec

    encoder = MsgpackEncoder()
    failed = EngineCoreOutputs(utility_output=UtilityOutput(3, failure_message="no such"))
    ours = codec.decode_outputs(encoder.encode(failed))
    assert ours.utility_output == codec.UtilityOutput(3, "no such", None)
    assert ours.outputs == [] and ours.scheduler_stats is None
    answer = EngineCoreOutputs(utility_output=UtilityOutput(4, result=UtilityResult(None)))
    got = codec.decode_outputs(encoder.encode(answer)).utility_output
    assert got is not None and (got.call_id, got.failure_message, got.value) == (4, None, None)


@case
def the_engine_dead_frame_is_reported_as_engine_lost() -> None:
    from vllm.v1.engine.core import EngineCoreProc

    from trioserve.enginecore import codec
    from trioserve.errors import EngineLostError

    try:
        codec.decode_outputs([EngineCoreProc.ENGINE_CORE_DEAD])
    except EngineLostError as exc:
        assert "ENGINE_CORE_DEAD" in str(exc)
    else:
        raise AssertionError("ENGINE_CORE_DEAD decoded as outputs")


# -- handshake -----------------------------------------------------------------------------


@case
def the_handshake_messages_are_vllms() -> None:
    import msgspec
    from vllm.v1.engine import EngineCoreReadyResponse
    from vllm.v1.engine.utils import EngineHandshakeMetadata

    from trioserve.enginecore import codec

    # What EngineCoreProc.startup_handshake and _perform_handshake send.
    hello = codec.decode_hello(
        msgspec.msgpack.encode({"status": "HELLO", "local": False, "headless": True})
    )
    assert (hello.status, hello.local, hello.headless) == ("HELLO", False, True)
    init = msgspec.msgpack.decode(
        codec.encode_init(["tcp://127.0.0.1:1", "tcp://127.0.0.1:3"], ["tcp://a:2", "tcp://a:4"]),
        type=EngineHandshakeMetadata,
    )
    assert init.addresses.inputs == ["tcp://127.0.0.1:1", "tcp://127.0.0.1:3"]
    assert init.addresses.outputs == ["tcp://a:2", "tcp://a:4"]
    assert init.addresses.coordinator_input is None and init.parallel_config == {}
    import vllm

    ready = EngineCoreReadyResponse(
        max_model_len=4096, num_gpu_blocks=100, block_size=16, dp_stats_address=None,
        dtype="float32", vllm_version=vllm.__version__, world_size=1,
        data_parallel_size=1, tensor_parallel_size=1, pipeline_parallel_size=1,
        decode_context_parallel_size=1, data_parallel_rank=0, max_num_seqs=64,
        max_num_batched_tokens=2048, instance_id="x", supports_lora=False, max_loras=0,
        kv_cache_size_tokens=1600,
    )  # fmt: skip
    ours = codec.decode_ready_response(msgspec.msgpack.encode(ready))
    assert ours == codec.EngineCoreReadyResponse(**dataclasses.asdict(ready))
    other = dataclasses.replace(ready, vllm_version="0.99.0")
    try:
        codec.decode_ready_response(msgspec.msgpack.encode(other))
    except ProtocolVersionError as exc:
        assert "0.99.0" in str(exc) and "0.32" in str(exc), exc
    else:
        raise AssertionError("vLLM 0.99.0 accepted")


def main() -> None:
    results = {}
    for name, function in CASES.items():
        try:
            function()
        except BaseException:
            results[name] = traceback.format_exc()
        else:
            results[name] = "ok"
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

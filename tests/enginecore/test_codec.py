"""The EngineCore codec on its own, without vLLM (tests/vllm/test_enginecore_codec.py holds
it to vLLM's structs): what it refuses, and the leniencies vLLM's own decoder has."""

from __future__ import annotations

import msgspec
import pytest

from trioserve.enginecore import codec
from trioserve.errors import EngineLostError, PeerProtocolError, ProtocolVersionError


def test_an_outputs_array_shorter_or_longer_than_ours_decodes():
    # vLLM only appends fields: an older engine sends fewer, a newer one more.
    short = msgspec.msgpack.encode([0, [["r", [1, 2]]]])
    assert codec.decode_outputs([short]).outputs[0].new_token_ids == [1, 2]
    output = ["r", [3], *[None] * 11, 0, *[None] * 4, "a field of a later vLLM"]
    longer = msgspec.msgpack.encode([0, [output], None, 1.0, None, None, None, None, None, 9])
    assert codec.decode_outputs([longer]).outputs[0].new_token_ids == [3]


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc1",  # not msgpack
        msgspec.msgpack.encode({"outputs": []}),  # a map, not the positional array
        msgspec.msgpack.encode([0, [["r", "not token ids"]]]),
        msgspec.msgpack.encode([0, [["r", [1], None, None, msgspec.msgpack.Ext(1, b"pickle")]]]),
    ],
)
def test_a_frame_that_is_not_engine_outputs_is_the_peers_error(frame):
    with pytest.raises(PeerProtocolError):
        codec.decode_outputs([frame])


def test_the_dead_frame_is_engine_lost():
    with pytest.raises(EngineLostError, match="ENGINE_CORE_DEAD"):
        codec.decode_outputs([codec.ENGINE_CORE_DEAD])


def test_an_array_index_outside_the_message_is_refused():
    array = codec.WireArray("<i4", [1, 1], 5)
    logprobs = codec.Logprobs(array, array, array)
    outputs = codec.EngineCoreOutputs(outputs=[codec.EngineCoreOutput("r", [1], logprobs)])
    with pytest.raises(PeerProtocolError, match="frame 5 of 2"):
        codec.decode_outputs([msgspec.msgpack.encode(outputs), b"\x00" * 4])


def test_arrays_read_back_in_their_shape():
    array = codec.WireArray.of("f", [2, 2], [0.5, -1.0, 2.0, 0.25])
    decoded = msgspec.msgpack.Decoder(codec.WireArray, ext_hook=codec._ext_hook).decode(
        msgspec.msgpack.encode(array)
    )
    assert decoded.tolist() == [[0.5, -1.0], [2.0, 0.25]]
    assert codec.WireArray("<i4", [0, 3], b"").tolist() == []
    assert codec.WireArray("<i8", [2, 0], b"").tolist() == [[], []]
    with pytest.raises(PeerProtocolError, match="shape"):
        codec.WireArray("<i4", [3], b"\x00" * 8).tolist()
    with pytest.raises(PeerProtocolError, match="dtype"):
        codec.WireArray("complex64", [1], b"\x00" * 8).tolist()


@pytest.mark.parametrize(
    ("version", "supported"),
    [("0.32.0", True), ("0.32.3+cpu", True), ("0.32", True), ("0.33.0", False), ("0.3.2", False)],
)
def test_versions(version, supported):
    assert codec.vllm_version_supported(version) is supported


def test_a_ready_response_of_another_vllm_is_refused_in_one_line_naming_both():
    ready = msgspec.msgpack.encode({"vllm_version": "0.40.1", "max_model_len": "moved"})
    with pytest.raises(ProtocolVersionError) as caught:
        codec.decode_ready_response(ready)
    assert str(caught.value) == (
        "the engine is vLLM 0.40.1; this trioserve speaks to vLLM 0.32.x only"
    )


def test_sampling_params_send_only_what_differs_from_vllms_defaults():
    params = codec.sampling_params({"max_tokens": 5, "temperature": 0.0, "_eos_token_id": 2})
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params)) == {
        "max_tokens": 5,
        "temperature": 0.0,
        "_eos_token_id": 2,
    }
    with pytest.raises(ValueError, match="max_tokens"):
        codec.sampling_params({"max_tokens": "5"})
    with pytest.raises(ValueError, match="no_such_field"):
        codec.sampling_params({"no_such_field": 1})

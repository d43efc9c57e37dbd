"""The codec, without any event loop: round trips and malformed frames."""

from __future__ import annotations

import random

import msgpack
import pytest

from trioserve.errors import PeerProtocolError
from trioserve.protocol import (
    PROTOCOL_VERSION,
    Abort,
    ErrorInfo,
    Hello,
    Limits,
    ModelCard,
    OutputItem,
    Outputs,
    Ping,
    Pong,
    Reject,
    Submit,
    Usage,
    Welcome,
    decode,
    encode,
)

EVERY_MESSAGE = [
    Hello(PROTOCOL_VERSION, "frontend-1"),
    Welcome(
        PROTOCOL_VERSION,
        "engine-a",
        "sess",
        [ModelCard("m1"), ModelCard("m2", owned_by="me")],
        ["chat", "completion"],
        Limits(max_requests=8, max_tokens=4096),
        frontend_timeout=5.0,
    ),
    Reject(PROTOCOL_VERSION, "no"),
    Submit("r1", "m1", "chat", {"messages": [{"role": "user", "content": "hi"}]}, {"seed": 3}),
    Abort(["r1", "r2"]),
    Ping(7),
    Pong(7, "sess", running=3, queued=1),
    Outputs(
        [
            OutputItem("r1", 0, data="hello"),
            OutputItem("r2", 4, modality="audio", data=b"\x00\x01\xff"),
            OutputItem("r1", 1, data=None, usage=Usage(2, 3), finish_reason="stop"),
            OutputItem("r3", 0, error=ErrorInfo(429, "too many", "rate_limit")),
            OutputItem("r4", 0, error=ErrorInfo(400, "too hot", "invalid_request", "temperature")),
        ]
    ),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message):
    assert decode(encode(message)) == message


def test_frame_is_tag_and_map():
    tag, body = msgpack.unpackb(encode(Ping(1)))
    assert tag == "ping" and body == {"seq": 1}


def test_output_items_leave_out_empty_fields():
    _, body = msgpack.unpackb(encode(Outputs([OutputItem("r", 0, data="x")])))
    assert body["items"] == [{"request_id": "r", "seq": 0, "data": "x"}]


def test_unknown_fields_are_ignored_for_forward_compatibility():
    frame = msgpack.packb(["ping", {"seq": 2, "added_in_a_later_version": [1, 2]}])
    assert decode(frame) == Ping(2)


def test_binary_data_stays_binary():
    item = decode(encode(Outputs([OutputItem("r", 0, data=b"\x89PNG")]))).items[0]
    assert item.data == b"\x89PNG"


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"\xc1", "not msgpack"),
        (encode(Ping(1))[:-1], "not msgpack"),
        (msgpack.packb({"seq": 1}), "array"),
        (msgpack.packb(["ping"]), "array"),
        (msgpack.packb(["nope", {}]), "unknown message tag 'nope'"),
        (msgpack.packb(["ping", [1]]), "must be a map"),
        (msgpack.packb(["ping", {"seq": "1"}]), "ping.seq"),
        (msgpack.packb(["ping", {}]), "ping.seq"),
        (msgpack.packb(["abort", {"request_ids": "r1"}]), "abort.request_ids"),
        (msgpack.packb(["outputs", {"items": [{"request_id": "r"}]}]), "outputs.items[0].seq"),
        (
            msgpack.packb(["outputs", {"items": [{"request_id": "r", "seq": 0, "data": 5}]}]),
            "outputs.items[0].data",
        ),
    ],
)
def test_malformed_frames_raise_protocol_error_naming_the_problem(frame, says):
    with pytest.raises(PeerProtocolError, match=None) as info:
        decode(frame)
    assert says in str(info.value)


def test_random_bytes_never_raise_anything_but_protocol_error():
    rng = random.Random(1234)
    valid = [encode(m) for m in EVERY_MESSAGE]
    for _ in range(3000):
        base = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 4)):
            base[rng.randrange(len(base))] = rng.randrange(256)
        try:
            decode(bytes(base))
        except PeerProtocolError:
            pass


def test_nil_means_the_fields_default():
    # Encoders in other languages often write nil for an empty map or list.
    frame = msgpack.packb(
        ["submit", {"request_id": "r", "model": "m", "task": "chat", "inputs": {}, "params": None}]
    )
    assert decode(frame).params == {}
    item = {"request_id": "r", "seq": 0, "modality": None, "data": "x", "usage": None}
    assert decode(msgpack.packb(["outputs", {"items": [item]}])).items[0].modality == "text"
    with pytest.raises(PeerProtocolError, match=r"ping\.seq"):
        decode(msgpack.packb(["ping", {"seq": None}]))


def test_error_items_leave_out_the_default_error_type():
    _, body = msgpack.unpackb(encode(Outputs([OutputItem("r", 0, error=ErrorInfo(500, "x"))])))
    assert body["items"][0]["error"] == {"status": 500, "message": "x"}


def test_the_outputs_fast_path_agrees_with_the_converter():
    from trioserve.protocol.codec import _fast_outputs, converter

    rng = random.Random(7)
    for _ in range(500):
        items = []
        for i in range(rng.randint(0, 5)):
            item = {"request_id": f"r{i}", "seq": rng.randint(0, 9)}
            for key, values in [
                ("data", ["tok", b"\x00", None, 5]),
                ("modality", ["text", "audio", None, 1]),
                ("finish_reason", ["stop", None, 2.5]),
                ("mime_type", ["image/png", None, b"x"]),
                (
                    "usage",
                    [
                        {"prompt_tokens": 1, "completion_tokens": 2},
                        {"prompt_tokens": 1, "completion_tokens": 2, "extra": 3},
                        {"prompt_tokens": 1, "completion_tokens": None},
                        {"prompt_tokens": 1},
                        {"prompt_tokens": True, "completion_tokens": 2},
                        {"prompt_tokens": 1.0, "completion_tokens": 2},
                        [1, 2],
                        None,
                    ],
                ),
            ]:
                if rng.random() < 0.4:
                    item[key] = rng.choice(values)
            items.append(item)
        body = {"items": items}
        fast = _fast_outputs(body)
        try:
            slow = converter.structure(body, Outputs)
        except Exception:
            slow = None
        if fast is not None:
            assert fast == slow  # whatever the fast path accepts, it builds identically
        frame = msgpack.packb(["outputs", body])
        if slow is None:
            with pytest.raises(PeerProtocolError):
                decode(frame)
        else:
            assert decode(frame) == slow


def test_the_last_item_of_a_request_takes_the_fast_path():
    from trioserve.protocol.codec import _fast_outputs

    usage = {"prompt_tokens": 3, "completion_tokens": 16}
    body = {"items": [{"request_id": "r", "seq": 15, "finish_reason": "stop", "usage": usage}]}
    fast = _fast_outputs(body)
    assert fast is not None
    assert fast.items[0].usage == Usage(3, 16)


@pytest.mark.parametrize(
    "submit",
    [
        Submit("r", "m", "chat", {"messages": [{"role": "user", "content": "hi"}]}),
        Submit(
            "r",
            "m",
            "chat",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {"type": "image", "media": {"mime_type": "image/png", "data": b"\x89"}},
                        ],
                    }
                ],
                "modalities": ["text", "image"],
            },
            {"max_tokens": 3, "temperature": 0.5, "stop": ["\n", "."], "seed": None},
        ),
        Submit("r", "m", "completion", {"prompt": "x"}, {"mock_by_seed": {"1": {"a": [1]}}}),
        Submit(
            "r",
            "m",
            "chat",
            {"messages": []},
            trace_context={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        ),
    ],
)
def test_a_submit_encodes_to_the_converters_bytes(submit):
    # encode() builds a submit's map by hand (the per-request path): it must be exactly
    # what the converter would have produced.
    from trioserve.protocol.codec import converter

    assert encode(submit) == msgpack.packb(["submit", converter.unstructure(submit)])


def test_a_submit_carries_its_trace_context_only_when_it_has_one():
    traced = Submit(
        "r",
        "m",
        "chat",
        {"messages": []},
        trace_context={
            "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
            "tracestate": "k=v",
        },
    )
    assert decode(encode(traced)) == traced
    plain = Submit("r", "m", "chat", {"messages": []})
    assert b"trace_context" not in encode(plain)
    assert decode(encode(plain)).trace_context is None


def test_a_submit_with_a_trace_context_of_the_wrong_type_is_malformed():
    frame = msgpack.packb(
        [
            "submit",
            {"request_id": "r", "model": "m", "task": "chat", "inputs": {}, "trace_context": "x"},
        ]
    )
    with pytest.raises(PeerProtocolError, match="trace_context"):
        decode(frame)


@pytest.mark.parametrize("queue_time", [0.25, 3])
def test_an_item_s_queue_time_decodes_on_the_fast_path_and_the_converters(queue_time):
    final = OutputItem("r", 1, data="x", usage=Usage(1, 2), finish_reason="stop")
    final.queue_time = queue_time
    frame = encode(Outputs([final]))
    assert decode(frame).items[0].queue_time == queue_time
    # The converter's path (an unknown key sends the frame there) reads it alike.
    raw = msgpack.unpackb(frame)
    raw[1]["items"][0]["something_new"] = 1
    assert decode(msgpack.packb(raw)).items[0].queue_time == queue_time


def test_an_item_s_queue_time_that_is_not_a_number_is_malformed():
    item = {"request_id": "r", "seq": 0, "finish_reason": "stop", "queue_time": "soon"}
    with pytest.raises(PeerProtocolError, match="queue_time"):
        decode(msgpack.packb(["outputs", {"items": [item]}]))


@pytest.mark.parametrize("stop_reason", ["</answer>", 128009])
def test_an_item_s_stop_reason_decodes_on_the_fast_path_and_the_converters(stop_reason):
    final = OutputItem("r", 1, data="x", usage=Usage(1, 2), finish_reason="stop")
    final.stop_reason = stop_reason
    frame = encode(Outputs([final]))
    assert decode(frame).items[0].stop_reason == stop_reason
    raw = msgpack.unpackb(frame)
    raw[1]["items"][0]["something_new"] = 1
    assert decode(msgpack.packb(raw)).items[0].stop_reason == stop_reason


def test_an_item_without_a_stop_reason_is_the_bytes_an_older_frontend_always_read():
    # An engine that predates the field sends none; a frontend that predates it reads
    # every item as before (unknown fields are ignored; this one is left out at nil).
    final = OutputItem("r", 1, data="x", usage=Usage(1, 2), finish_reason="stop")
    assert b"stop_reason" not in encode(Outputs([final]))
    assert decode(encode(Outputs([final]))).items[0].stop_reason is None


@pytest.mark.parametrize("value", [True, 1.5, b"</s>", ["</s>"]])
def test_an_item_s_stop_reason_that_is_not_a_string_or_an_integer_is_malformed(value):
    item = {"request_id": "r", "seq": 0, "finish_reason": "stop", "stop_reason": value}
    with pytest.raises(PeerProtocolError, match="stop_reason"):
        decode(msgpack.packb(["outputs", {"items": [item]}], use_bin_type=True))


#: A first item with what a request asked about its prompt, as the shared vLLM engine sends
#: it (``return_token_ids``, ``prompt_logprobs``: vLLM's shape, the first position null).
PROMPT_LOGPROBS = [
    None,
    {
        "7": {"logprob": -2.5, "rank": 3, "decoded_token": " K"},
        "9": {"logprob": -0.5, "rank": 1, "decoded_token": "ö"},
    },
    {"11": {"logprob": -9999.0, "rank": 40, "decoded_token": "ln"}},
]


def test_an_item_s_token_ids_and_prompt_details_round_trip():
    first = OutputItem("r", 0, data="Köln", token_ids=[5, 6])
    first.prompt_token_ids = [1, 7, 11]
    first.prompt_logprobs = PROMPT_LOGPROBS
    later = OutputItem("r", 1, data="!", token_ids=[8], finish_reason="stop", usage=Usage(3, 3))
    empty = OutputItem("r", 2, token_ids=[])  # a step whose token the stop string cut
    frame = encode(Outputs([first, later, empty]))
    assert decode(frame) == Outputs([first, later, empty])
    _, body = msgpack.unpackb(frame)
    assert body["items"][1].keys() == {
        "request_id", "seq", "data", "token_ids", "finish_reason", "usage"
    }  # fmt: skip


def test_an_item_without_token_ids_or_prompt_details_is_the_bytes_an_older_frontend_read():
    # Added without a version bump: left out at nil, so what a frontend that predates them
    # receives is what it always did (and one that has them it ignores, as every unknown
    # field); a frontend that knows them reads None from an older engine.
    item = OutputItem("r", 0, data="x", usage=Usage(1, 2), finish_reason="stop")
    frame = encode(Outputs([item]))
    for name in (b"token_ids", b"prompt_token_ids", b"prompt_logprobs"):
        assert name not in frame
    decoded = decode(frame).items[0]
    assert (decoded.token_ids, decoded.prompt_token_ids, decoded.prompt_logprobs) == (None,) * 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token_ids", [1, "2"]),
        ("token_ids", 3),
        ("token_ids", [1.5]),
        ("prompt_token_ids", "1 2"),
        ("prompt_token_ids", [True]),
        ("prompt_logprobs", {"1": {}}),
    ],
)
def test_token_ids_and_prompt_details_of_the_wrong_type_are_malformed(field, value):
    item = {"request_id": "r", "seq": 0, "data": "x", field: value}
    with pytest.raises(PeerProtocolError, match=field):
        decode(msgpack.packb(["outputs", {"items": [item]}]))


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "unpackable",
    [2**70, _nested(2000), object()],
    ids=["integer-past-64-bits", "nested-past-the-recursion-limit", "an-object"],
)
@pytest.mark.parametrize("prompt_bytes", [1000, 2 << 20], ids=["small", "past-the-kept-size"])
def test_a_failed_pack_leaves_nothing_in_the_next_frame(unpackable, prompt_bytes):
    # The codec packs with one module-level Packer. A pack that fails half-way (a value
    # msgpack cannot encode after a prompt already written) must not leave its bytes in
    # the packer's buffer: the next frame, sent to an engine, would carry them first.
    bad = Submit("r-bad", "m1", "chat", {"prompt": "p" * prompt_bytes, "x": unpackable}, {})
    good = Submit("r-good", "m1", "chat", {"prompt": "fine"}, {"seed": 1})
    expected = msgpack.packb(["submit", msgpack.unpackb(encode(good))[1]], use_bin_type=True)
    with pytest.raises((OverflowError, ValueError, TypeError)):
        encode(bad)
    assert encode(good) == expected
    assert decode(encode(Ping(3))) == Ping(3)

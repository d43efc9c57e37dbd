"""Property-based fuzzing of the ZMTP framer (hypothesis), seeded and bounded: generated
engine traffic under NULL and CURVE, mutated and cut into arbitrary reads, must raise
nothing but ZmtpProtocolError, stay within its memory bounds, and deliver exactly (under CURVE:
only) what the engine sent (the properties: tests/helpers/zmtp_fuzz.py).
``tools/fuzz_zmtp.py`` runs the same for as long as asked, unseeded."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.zmtp_fuzz import (
    check_curve,
    check_null_mutated,
    check_null_valid,
    check_valid_then_garbage,
    curve_session,
    mutated,
    null_traffic,
    reads,
    stray_frame,
)
from tests.helpers.zmtp_peer import null_handshake

SEEDED = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(SEEDED, max_examples=200)
@given(st.data())
def test_valid_traffic_parses_into_exactly_its_messages_however_it_is_cut(data):
    traffic = data.draw(null_traffic())
    check_null_valid(traffic, data.draw(reads(traffic[0])))


@settings(SEEDED, max_examples=400)
@given(st.data())
def test_mutated_traffic_raises_only_the_protocol_error_within_bounds(data):
    stream, _ = data.draw(null_traffic())
    check_null_mutated(data.draw(reads(data.draw(mutated(stream)))))


@settings(SEEDED, max_examples=300)
@given(st.data())
def test_arbitrary_bytes_raise_only_the_protocol_error(data):
    # From the first byte, from within the greeting, and after the handshake; as bytes
    # and as frames of any flags and shape.
    prefix = data.draw(st.sampled_from([b"", null_handshake()[:20], null_handshake()]))
    tail = data.draw(
        st.one_of(st.binary(max_size=300), st.lists(stray_frame, max_size=8).map(b"".join))
    )
    check_null_mutated(data.draw(reads(prefix + tail)))


@settings(SEEDED, max_examples=200)
@given(st.data())
def test_garbage_after_a_valid_stream_or_before_a_fresh_one_loses_no_message(data):
    traffic = data.draw(null_traffic())
    garbage = data.draw(st.one_of(st.binary(max_size=100), mutated(traffic[0])))
    check_valid_then_garbage(traffic, garbage, data.draw(reads(traffic[0])))


@settings(SEEDED, max_examples=100)
@given(st.data())
def test_curve_traffic_parses_into_exactly_its_messages_however_it_is_cut(data):
    session = data.draw(curve_session())
    check_curve(session, data.draw(reads(session.stream)), mutated=False)


@settings(SEEDED, max_examples=200)
@given(st.data())
def test_mutated_curve_traffic_never_delivers_an_altered_message(data):
    session = data.draw(curve_session())
    check_curve(session, data.draw(reads(data.draw(mutated(session.stream)))), mutated=True)


@settings(SEEDED, max_examples=150)
@given(st.data())
def test_stray_frames_after_a_curve_handshake_raise_only_the_protocol_error(data):
    # At frame boundaries, with nonces the session may be at: boxes too short, boxes
    # that do not open, commands in clear text.
    session = data.draw(curve_session())
    strays = data.draw(st.lists(stray_frame, min_size=1, max_size=4).map(b"".join))
    check_curve(session, data.draw(reads(session.stream + strays)), mutated=True)

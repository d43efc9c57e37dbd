"""Property-based fuzzing of HTTP/1.1 on the built-in server (hypothesis), seeded and bounded:
the sans-io parser raises only its ``HttpProtocolError``; the running server survives each
connection, HTTP or WebSocket frames, and serves the next request. The traffic and the
properties are in tests/helpers/http1_fuzz.py; ``tools/fuzz_http.py`` runs the same
properties for as long as asked, unseeded.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.http1_fuzz import (
    check_parser,
    reads,
    run_server_check,
    traffic,
    websocket_traffic,
)

# -- the tests (seeded, bounded: the file runs in seconds) ---------------------------------

SEEDED = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(SEEDED, max_examples=400)
@given(st.data())
def test_the_parser_raises_only_its_protocol_error(data):
    check_parser(data.draw(reads(data.draw(traffic))))


@settings(SEEDED, max_examples=300)
@given(st.data())
def test_the_parser_on_arbitrary_bytes_raises_only_its_protocol_error(data):
    check_parser(data.draw(reads(data.draw(st.binary(max_size=200)))))


@settings(SEEDED, max_examples=100)
@given(st.data())
def test_the_server_survives_mutated_traffic_and_serves_the_next_request(data):
    run_server_check(data.draw(reads(data.draw(traffic))))


@settings(SEEDED, max_examples=100)
@given(st.data())
def test_the_server_survives_mutated_websocket_frames_and_serves_the_next_request(data):
    run_server_check(data.draw(reads(data.draw(websocket_traffic))))

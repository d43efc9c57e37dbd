"""What a client is told of each way a request fails (``http/errors.py``)."""

from __future__ import annotations

from trioserve.ends import EndReason
from trioserve.http.errors import END_ANSWERS, GOING_AWAY, POLICY_VIOLATION, end_error


def test_every_end_reason_has_its_answer():
    # A new reason without a row fails here, not on a client's request.
    assert set(END_ANSWERS) == set(EndReason)
    for reason, answer in END_ANSWERS.items():
        assert answer.status in (200, 499, 500, 502, 503, 504)
        assert (answer.code == "") == (reason is EndReason.STOP_STRING)
        assert (answer.message == "") == (reason is EndReason.STOP_STRING)


def test_an_end_reason_is_told_with_its_status_code_and_message():
    error = end_error(EndReason.ENGINE_LOST)
    assert (error.status, error.code, error.message) == (
        503,
        "engine_lost",
        "the engine stopped responding",
    )
    deadline = end_error(EndReason.DEADLINE, "the request exceeded its deadline of 2 s")
    assert (deadline.status, deadline.code) == (504, "deadline_exceeded")
    assert deadline.message == "the request exceeded its deadline of 2 s"


def test_only_the_drain_closes_a_websocket_as_going_away():
    for reason, answer in END_ANSWERS.items():
        expected = GOING_AWAY if reason is EndReason.DRAIN else POLICY_VIOLATION
        assert answer.close_code == expected

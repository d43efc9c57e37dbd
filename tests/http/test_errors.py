"""What a client is told of each way a request fails (``http/errors.py``)."""

from __future__ import annotations

from trioserve import errors
from trioserve.ends import EndReason
from trioserve.errors import (
    ChatTemplateError,
    EngineLostError,
    InputError,
    NoEngineError,
    PromptTooLongError,
    SlowClientError,
    TextInputError,
    UnencodableRequestError,
    UnsupportedContentError,
    WriterFailedError,
)
from trioserve.http.errors import (
    END_ANSWERS,
    GOING_AWAY,
    POLICY_VIOLATION,
    HTTPError,
    end_error,
    http_error,
    status_of,
)


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


def test_a_neutral_error_is_answered_with_the_status_of_its_row():
    refused = http_error(PromptTooLongError("too long", param="messages"))
    assert (refused.status, refused.message, refused.code, refused.param) == (
        400,
        "too long",
        "context_length_exceeded",
        "messages",
    )
    assert http_error(InputError("bad", code="invalid_prompt")).status == 400
    for error_type in (ChatTemplateError, UnsupportedContentError, TextInputError):
        assert status_of(error_type("x")) == 400
    assert status_of(UnencodableRequestError("x")) == 422
    lost = http_error(EngineLostError("gone"))
    assert (lost.status, lost.message, lost.code) == (503, "gone", "engine_lost")
    assert status_of(NoEngineError("x")) == 503
    assert status_of(SlowClientError("x")) == 503
    assert status_of(WriterFailedError("x")) == 500
    already = HTTPError(409, "taken", "duplicate_id")
    assert http_error(already) is already


def test_the_layers_beneath_give_no_error_an_http_status():
    # Which status an error is answered with is the HTTP layer's table, not the error's.
    for name in dir(errors):
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, errors.TrioserveError):
            assert "status" not in vars(value), name
